"""Training, in parts a reader can hold (train.train puts them together):

- stops.py: TrainError, Diverged, Stopped/Terminated and the stop signals' handling
  (SIGINT, SIGTERM, SIGHUP stop with a backup; SIGUSR1 saves one);
- schedule.py: Darknet's schedules (numbered weights, --map interval, multi-scale sizes)
  and the learning-rate warnings;
- chart.py: chart_<cfg>.png and the history behind it;
- checkpoints.py: the backup directory's files, their names and their writing;
- plan.py: everything decided before a run starts (checks, the resume point, outputs and
  refused overwrites), testable without training;
- loop.py: the loop, its iteration lines and how a run ends.

This file imports none of them.
"""
