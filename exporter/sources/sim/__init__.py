"""The sim source: the simulated fleet (source.py), options in options.py."""
