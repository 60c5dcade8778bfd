"""MTP Studio desktop GUI (Qt)."""
