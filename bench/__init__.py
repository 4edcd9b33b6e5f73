"""darknet-py's benchmarks, by subject (kernels, networks, training, cpu, data, multigpu,
learning); `python3 bench/run.py --list` names each subject's scripts and runs them."""
