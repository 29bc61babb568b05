"""The files a real-server VM boots from: its /init script, a UDP echo helper, and the initramfs builder."""
