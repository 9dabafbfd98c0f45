"""Fuzzers for the MQTT codec and the running broker (`make fuzz`; a short run in `make test`).

Top-level rather than under tools/: tools/ holds build steps, these are test drivers with
a seed corpus generator shared by two fuzzers and by tests/fuzz.
"""
