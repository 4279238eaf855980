"""Which kernels PyTorch eager runs for each resnet fp16 conv (channels_last, cudnn.benchmark),
at a given torch.backends.cudnn.benchmark_limit, and their warm time in a CUDA graph."""
import re, sys, torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
limit, batch = int(sys.argv[1]), int(sys.argv[2])
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.benchmark_limit = limit
layers = [(3,224,64,7,2,3),(64,56,64,1,1,0),(64,56,64,3,1,1),(64,56,256,1,1,0),(256,56,128,1,2,0),
          (128,28,128,3,1,1),(128,28,512,1,1,0),(512,28,256,1,2,0),(256,14,256,3,1,1),
          (256,14,1024,1,1,0),(1024,14,512,1,2,0),(512,7,512,3,1,1),(512,7,2048,1,1,0)]
for c,h,k,r,st,p in layers:
    x = torch.randn(batch,c,h,h,device="cuda",dtype=torch.half).to(memory_format=torch.channels_last)
    w = torch.randn(k,c,r,r,device="cuda",dtype=torch.half).to(memory_format=torch.channels_last)
    f = lambda: F.conv2d(x, w, None, stride=st, padding=p)
    for _ in range(3): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): f()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(e.name, []).append(e.device_time)
    parts = "; ".join(f"{n[:90]} x{len(t)//5} {sorted(t)[len(t)//2]:.2f}us" for n, t in kernels.items())
    print(f"c{c} h{h} k{k} r{r} st{st}: {parts}", flush=True)
