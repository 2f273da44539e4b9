"""Benchmarks, run as `python -m hvd_lossy.bench SUBCOMMAND [options]`:

    codec      compression ratio and throughput of the codec alone (hvd_lossy.bench.codec)
    alltoall   the embedding all-to-all over Horovod, under mpirun (hvd_lossy.bench.alltoall)
    netlink    all-to-all and DLRM training over an emulated link of 1-100 Gbit/s, as root
               (hvd_lossy.bench.netlink; it runs the ranks itself)
"""
