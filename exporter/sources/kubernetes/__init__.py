"""The kubernetes source: GPU nodes, pods, MIG, time-slicing and DRA claims from the apiserver.

informer.py lists and watches (plain aiohttp); source.py turns the stored objects into a
fleet; options.py declares ``sources.kubernetes`` (cheap to import)."""
