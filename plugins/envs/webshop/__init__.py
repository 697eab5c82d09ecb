"""WebShop (in progress)."""
