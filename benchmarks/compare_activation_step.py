"""The MLP training step with GELU vs ReLU, against PyTorch on the CPU (same model, same SGD step,
2 threads; medians of 20). Needs PyTorch: run it from a separate venv that has torch, with
gputrain's build on PYTHONPATH (never install torch into the test venv).

    PYTHONPATH=<build>/lib.linux-x86_64-cpython-311 /path/to/venv-with-torch/bin/python benchmarks/compare_activation_step.py
"""
import time, numpy as np, gputrain as gt, torch
def med(fn, n=20):
    fn(); ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return np.median(ts)*1e3
rng=np.random.default_rng(0); x=rng.standard_normal((256,784)).astype(np.float32); y=rng.integers(0,10,256)
for act in ("gelu","relu"):
    gt.random.manual_seed(0)
    A = (lambda: gt.nn.GELU()) if act=="gelu" else (lambda: gt.nn.ReLU())
    m=gt.nn.Sequential(gt.nn.Linear(784,1024),A(),gt.nn.Linear(1024,1024),A(),gt.nn.Linear(1024,10))
    s=gt.TrainStep(m, gt.nn.CrossEntropyLoss(), gt.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9))
    ours=med(lambda: s(x,y))
    torch.set_num_threads(2); TA = torch.nn.GELU if act=="gelu" else torch.nn.ReLU
    tm=torch.nn.Sequential(torch.nn.Linear(784,1024),TA(),torch.nn.Linear(1024,1024),TA(),torch.nn.Linear(1024,10))
    opt=torch.optim.SGD(tm.parameters(), lr=1e-3, momentum=0.9); lf=torch.nn.CrossEntropyLoss()
    tx,ty=torch.from_numpy(x),torch.from_numpy(y)
    def ts():
        opt.zero_grad(set_to_none=True); lf(tm(tx),ty).backward(); opt.step()
    theirs=med(ts)
    print(act, "ours ms", round(ours,2), "torch ms", round(theirs,2), "speedup", round(theirs/ours,2))
