"""A neighbour that keeps MiB of its own data hot in the shared L3 (reads it over and over), on its own core."""
import sys, time, torch
torch.set_num_threads(1)
mib = int(sys.argv[1]); secs = float(sys.argv[2])
a = torch.ones(mib << 18, dtype=torch.float32)  # mib MiB
end = time.monotonic() + secs
n = 0
while time.monotonic() < end:
    a.sum(); n += 1
print(f"neighbour {mib} MiB: {n} passes", flush=True)
