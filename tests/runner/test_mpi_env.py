"""Where mpirun puts a rank, read from each MPI family's launcher variables (the launch itself is tested with
real mpirun processes in test_parallel_ranks.py)."""

from __future__ import annotations

from engine_builder.runner.parallel.mpi_env import MpiPlace, mpi_place


def test_open_mpi_variables():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert mpi_place(env) == MpiPlace(rank=3, size=4, local_rank=1, local_size=2)


def test_hydra_variables_of_mpich_and_intel_mpi():
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert mpi_place(env) == MpiPlace(rank=1, size=2, local_rank=1, local_size=2)


def test_no_launcher_no_place():
    assert mpi_place({"RANK": "0", "WORLD_SIZE": "2"}) is None
