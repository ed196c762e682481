"""Makes the SQL example's database, data/shop.db beside this file: a table of three items."""

import sqlite3
from pathlib import Path

path = Path(__file__).resolve().parent / "data" / "shop.db"
path.parent.mkdir(exist_ok=True)
path.unlink(missing_ok=True)
db = sqlite3.connect(path)
with db:
    db.execute("CREATE TABLE items (name TEXT, price REAL)")
    db.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 1.5), ("ink", 4.25), ("pad", 2.0)])
db.close()
