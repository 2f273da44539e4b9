"""Benchmarks, run as `python -m hvd_lossy.bench SUBCOMMAND [options]`:

    codec      compression ratio and throughput of the codec alone (hvd_lossy.bench.codec)
    alltoall   the embedding all-to-all over Horovod, under mpirun (hvd_lossy.bench.alltoall)
"""
