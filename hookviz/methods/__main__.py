"""``python -m hookviz.methods``: the README's method table, from the registry."""

from hookviz.methods import table

print(table(), end="")
