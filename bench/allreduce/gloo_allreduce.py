"""PyTorch gloo all_reduce bandwidth on loopback: same sizes, processes and measure as
ring_bench (bytes / time of one all-reduce, median of repeats, slowest rank)."""
import os, statistics, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs import free_port  # noqa: E402


def worker(rank, world, port, sizes, reps, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        for _ in range(2):
            dist.all_reduce(t)
        times = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        med = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        if rank == 0:
            q.put((world, nbytes, nbytes / med.item() / 1e9))
    dist.destroy_process_group()


if __name__ == "__main__":
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    sizes = [1 << 20, 16 << 20, 64 << 20]
    ctx = mp.get_context("spawn")
    for world in (2, 4):
        q = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, world, port, sizes, reps, q)) for r in range(world)]
        for p in procs:
            p.start()
        for _ in sizes:
            w, n, g = q.get(timeout=600)
            print(w, n, "%.4f" % g, flush=True)
        for p in procs:
            p.join(60)
