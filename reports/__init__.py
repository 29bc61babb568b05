"""The results schema every suite writes and the HTML report rendered from those results only."""
