"""Multi-node DDP with a training snapshot, in the style of PyTorch's DDP tutorial series (multinode.py).

    torchrun --nnodes 2 --nproc-per-node 1 ... snapshot_script.py --total-epochs 4 --snapshot-path /ckpt/snapshot.pt

It knows nothing of the entrypoint: torchrun's variables, a snapshot saved by global rank 0 every epoch and
loaded at start if present, the model written at the end.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, step_sleep):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.step_sleep = step_sleep
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch, max_epochs):
        b_sz = len(next(iter(self.train_data))[0])
        steps = len(self.train_data)
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {steps}")
        self.train_data.sampler.set_epoch(epoch)
        for i, (source, targets) in enumerate(self.train_data):
            self._run_batch(source, targets)
            if self.global_rank == 0:
                print(f"epoch {epoch + 1}/{max_epochs} step {epoch * steps + i + 1}/{max_epochs * steps}", flush=True)
            time.sleep(self.step_sleep)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch, max_epochs)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def main(save_every, total_epochs, batch_size, snapshot_path, model_out, step_sleep):
    init_process_group(backend="gloo")
    dataset = MyTrainDataset(512)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    train_data = DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False,
                            sampler=DistributedSampler(dataset))
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, step_sleep)
    trainer.train(total_epochs)
    if int(os.environ["RANK"]) == 0:
        os.makedirs(os.path.dirname(model_out), exist_ok=True)
        torch.save(trainer.model.module.state_dict(), model_out)
        print(f"model written to {model_out}")
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--total-epochs", type=int, default=4)
    parser.add_argument("--save-every", type=int, default=1)
    parser.add_argument("--batch-size", default=32, type=int)
    parser.add_argument("--snapshot-path", default="snapshot.pt")
    parser.add_argument("--model-out", default=os.path.join(os.environ.get("AIP_MODEL_DIR", "model"), "model.pt"))
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot_path, args.model_out, args.step_sleep)
