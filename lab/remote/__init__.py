"""Labs beyond this machine's namespaces: targets over SSH, Vagrant machines, qemu VMs."""
