"""Data-parallel training: one process per device, the result of one device with the
combined batch.

Every process (a *rank*) holds the whole network, trains on its own images and, before
each update, the ranks sum their accumulated gradients, so every rank applies the same
update and the weights stay identical (Darknet's C code instead averages the weights
every few iterations, so its result depends on the GPU count).

Momentum lives in the update buffers (Darknet keeps `momentum * previous update` there
after each step): summing every rank's buffer would count it once per rank, so only rank
0 keeps it; the other ranks zero their buffers after each update, so they hold just
their own gradients when the next sum is taken. Batch-norm rolling statistics are
averaged. Batch statistics stay per rank (as Darknet's multi-GPU training and PyTorch's
DDP without SyncBatchNorm), so with batch norm the run matches one device only in
expectation; without it, to float32 rounding.

The package, bottom to top:
- comm.py: the Communicator interface and `TcpCommunicator` (processes on one or several
  hosts over TCP; the NumPy backend);
- nccl.py: `NcclCommunicator` (CUDA devices; it rendezvouses through a TcpCommunicator
  and keeps it for barriers);
- buckets.py: the gradients grouped in buckets whose sums start while the backward still
  runs, and the 16-bit exchange under fp16/bf16 training;
- data_parallel.py: the policy above (`DataParallel`, the hook Network.update calls) and
  `Ranks`, what train() asks about the run it is part of;
- cluster.py: the variables of a cluster's launcher (Slurm's srun, torchrun) that make
  this process one rank;
- launcher.py: `launch` starts the ranks of one node (each runs train()) and ends them
  all, with one line naming the rank, when one fails; `run_as_cluster_rank` runs this
  process as the rank cluster.py read. Only the command line imports it.

This file imports none of them, so that train (which imports data_parallel) and the
launcher (which imports train) do not meet in a cycle.
"""
