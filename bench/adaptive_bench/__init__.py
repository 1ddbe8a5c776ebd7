"""bench/adaptive.py's benchmark, one responsibility per module (bench/adaptive.py holds
the description, the command line and the entry point of every child process):

  tasks      the datasets, models, optimizer and accuracy every run trains and evaluates
  loops      what runs inside the workers: raylight's and Ray Train's training loops
  children   the child processes, one run (or one fixed series of runs) each
  parent     the parent's side of one child: launch it, time it, read it into a record
  analysis   the throughput model's prediction error: forward predictions at each
             decision, leave-one-layout-out on the profiles
  summary    medians over the repetitions, the named figures and their goals
  report     the table on stdout
  benchmark  the sections and repetitions of one benchmark, its results and their files

Children run ``python bench/adaptive.py --child NAME --job JSON``; bench/ is then first on
sys.path, and Ray's workers get it too (Ray adds the driver script's directory), so they
import the loops from this package by name.

The constants below are the benchmark's fixed shape, shared by the modules.
"""

NUM_WORKERS = 2
SKIP_STEPS = 20  # steps left out of steady throughput
MIN_PROFILE_STEPS = 5  # optimizer steps a layout needs to count (the engine's default)
TTT_SYSTEMS = ("raylight_fixed", "ray_train_fixed", "raylight_adaptive")
TPUT_SYSTEMS = ("raylight_fixed", "raylight_pinned")
TPUT_ORDER = ("raylight_fixed", "raylight_pinned", "raylight_pinned", "raylight_fixed")
# in_place: a warm spare process waits beside rank 0 (the default); in_place_cold: none
# (warm_spare=False), the new worker starts and imports when the grow is decided.
RESIZE_KINDS = ("in_place", "in_place_cold", "checkpoint")
PHASES = ("spawn_s", "warm_s", "stop_s", "launch_s", "spares")  # of an in-place resize
