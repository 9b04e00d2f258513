"""The command-line tools on top of the library: bench, report, calibrate, demo, sim/model,
train, launch. Nothing in `ringmpi/` outside this folder parses command lines or prints
tables; these modules use the library's public layers only."""
