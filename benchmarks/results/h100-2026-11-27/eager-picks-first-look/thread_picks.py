"""Does PyTorch re-run cudnn.benchmark in a new thread (its cuDNN v8 plan cache is per thread)?
For three resnet b8 layers: the first call's wall time and the kernel run, per thread."""
import threading, time, torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.benchmark_limit = 0
def layer(c,h,k,r,st,p):
    x = torch.randn(8,c,h,h,device="cuda",dtype=torch.half).to(memory_format=torch.channels_last)
    w = torch.randn(k,c,r,r,device="cuda",dtype=torch.half).to(memory_format=torch.channels_last)
    return lambda: F.conv2d(x, w, None, stride=st, padding=p)
def probe(f, tag, out):
    torch.cuda.synchronize(); t=time.perf_counter(); f(); torch.cuda.synchronize(); first=(time.perf_counter()-t)*1e3
    t=time.perf_counter(); f(); torch.cuda.synchronize(); second=(time.perf_counter()-t)*1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20): f()
        torch.cuda.synchronize()
    ks={}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA: ks.setdefault(e.name[:70],[]).append(e.device_time)
    out.append(f"{tag}: first call {first:.1f} ms, second {second:.2f} ms; " + "; ".join(f"{n} {sorted(v)[len(v)//2]:.2f}us" for n,v in ks.items()))
for spec in [(128,28,512,1,1,0),(512,7,2048,1,1,0),(256,14,1024,1,1,0)]:
    f = layer(*spec); out=[]
    probe(f, f"{spec} main", out); probe(f, f"{spec} main again", out)
    for i in range(4):
        th = threading.Thread(target=probe, args=(f, f"{spec} thread {i}", out)); th.start(); th.join()
    print("\n".join(out), flush=True)
