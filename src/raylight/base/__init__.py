"""The base wing: what every other wing may use and that imports no other raylight
module: time, errors, exit codes, verbosity, network addresses, pure cost math.
"""
