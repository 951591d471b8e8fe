"""What the user declares and what runtimes accept: the topology schema (:mod:`.topology`),
loading it with line numbers (:mod:`.load`), addresses, device kinds, plugin profiles, the
facts per vLLM release (:mod:`.facts`, generated from the wheels) and the backends' settings.
Pure data: imports nothing of pdlaunch above it."""
