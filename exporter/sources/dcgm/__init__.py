"""The dcgm source: dcgm-exporter endpoints.

source.py scrapes the targets; exposition_parser.py reads the text format; fields.py maps
DCGM fields onto snapshot records (also used by the prometheus source); options.py declares
``sources.dcgm``."""
