"""How other software reaches callbox: each door is a thin adapter on the session core."""
