"""``hookviz serve``: one process that has imported torch and keeps models warm, so that a shell loop
calling ``hookviz`` once per file costs a fork, not an interpreter and torch's import.

* :mod:`.paths`: where the socket lives and whether it can be trusted (a folder only the user can open).
* :mod:`.client`: the ``hookviz`` entry point; hands the command to a running server (with its own stdin,
  stdout and stderr, passed over the socket), or runs it here. Imports neither torch nor typer.
* :mod:`.server`: the server: a single-threaded loop that forks a child per request (the child inherits
  torch and the warm models), reports its exit code, and learns which models to keep warm."""
