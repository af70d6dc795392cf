"""``python -m hookviz.methods``: the method table of docs/methods.md, from the registry."""

from hookviz.methods import table

print(table(), end="")
