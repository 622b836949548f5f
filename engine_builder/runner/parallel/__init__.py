"""tp/pp engines at run time: collectives over torch.distributed, one rank per process (see launch.py)."""
