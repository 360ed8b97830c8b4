"""Handwritten digits with Horovod, written as an ordinary Horovod script (no hooks).

The entrypoint starts one process per GPU on every replica and lets them meet through Horovod's gloo
rendezvous on the chief (no ssh, no horovodrun), with tuned fusion buffers. The script uses the
small context API only to learn where outputs go and to report the tuning metric. Launch:

    python -m entrypoint local --workers 2 -- run --framework horovod --module trainers.digits_horovod

(`make demo-horovod`). Reaches >= 95% validation accuracy in 15 epochs on CPU.
"""

from __future__ import annotations

import argparse
import json
import os

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from entrypoint import context
from trainers.digits_data import load_digits

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=15)
parser.add_argument("--batch-size", type=int, default=32, help="per process")
parser.add_argument("--lr", type=float, default=0.05, help="per process; scaled by the world size")
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")

# Data: scikit-learn's bundled 8x8 digits, split once with a fixed seed.
pixels, labels = load_digits()  # scikit-learn's load_digits(return_X_y=True), without importing scikit-learn
x = torch.tensor(pixels / 16.0, dtype=torch.float32)
y = torch.tensor(labels, dtype=torch.long)
order = np.random.default_rng(0).permutation(len(x))
train_idx, val_idx = order[: int(0.8 * len(x))], order[int(0.8 * len(x)):]
train = TensorDataset(x[train_idx], y[train_idx])
sampler: DistributedSampler[TensorDataset] = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), seed=0)
loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

# Model and optimizer: rank 0's initial state reaches every rank; gradients are averaged by allreduce.
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

step = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    model.train()
    for inputs, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        step += 1
    # Evaluate this rank's shard, then sum the counts across ranks.
    model.eval()
    shard = val_idx[hvd.rank():: hvd.size()]
    with torch.no_grad():
        correct = (model(x[shard].to(device)).argmax(-1).cpu() == y[shard]).sum()
    totals = hvd.allreduce(torch.tensor([float(correct), float(len(shard))]), op=hvd.Sum)
    accuracy = float(totals[0] / totals[1])
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}/{args.epochs} step {step} loss {loss.item():.4f} val accuracy {accuracy:.4f}",
              flush=True)
    context.report_metric("accuracy", accuracy, step)  # written by the chief only

if context.is_chief():
    os.makedirs(context.model_dir(), exist_ok=True)
    torch.save(model.state_dict(), os.path.join(context.model_dir(), "state_dict.pt"))
    with open(os.path.join(context.model_dir(), "metrics.json"), "w") as f:
        json.dump({"accuracy": accuracy, "steps": step, "world_size": hvd.size()}, f)
    print(f"model exported to {context.model_dir()}", flush=True)
hvd.shutdown()
