"""Copy bandwidth at qnorm_rope_kv_insert's production sizes, measured the way `dsv4ops bench`
times ops (rotating buffers over twice the L2, one CUDA graph), next to the 1 GiB copy that sets the
bench's bandwidth ceiling. A copy of the insert's query bytes is the fastest the insert could run.

    python3 tools/copy_at_size.py        (on the GPU machine, after tools/gpu_install.sh)
"""
import torch

from dsv4ops import bench

DEVICE = "cuda"
print("copy ceiling (1 GiB)", round(bench._copy_gbps(DEVICE)), "GB/s")
for T, H in [(128, 64), (128, 128)]:
    nbytes = T * H * 512 * 2                      # bf16 q [T, H, 512], read once and written once
    n_sets = max(2, (200 << 20) // (2 * nbytes))
    sets = [dict(src=torch.randn(nbytes // 2, device=DEVICE, dtype=torch.bfloat16),
                 dst=torch.empty(nbytes // 2, device=DEVICE, dtype=torch.bfloat16)) for _ in range(n_sets)]
    us, mode = bench.time_calls(lambda kw: kw["dst"].copy_(kw["src"]), sets)
    print(f"copy of the insert's q (T={T} H={H}: {nbytes/1e6:.1f} MB read + written): {us:.2f} us = "
          f"{2*nbytes/us/1e3:.0f} GB/s [{mode}]")
