"""AdaptDL's CIFAR example (examples/pytorch-cifar/main.py of petuum/adaptdl, Apache-2.0,
Copyright 2020 Petuum, Inc.), in its shape: the same adaptdl calls, the rank-0-first data
barrier, per-parameter SGD groups, MultiStepLR, ``AdaptiveDataParallel(net, optimizer,
lr_scheduler, scaler)``, the mixed-precision loop (``scaler.scale(loss).backward()``,
``scaler.step(optimizer)``, ``scaler.update()`` at every step), ``to_tensorboard`` and the
Accumulators. What differs, so that it runs in seconds on a CPU without a download:
- the data: scikit-learn's bundled 8x8 digits as 3-channel images (a ``CIFAR10``-like
  class with the same ``root, train, download, transform`` arguments), the transforms
  (random crop with padding, normalise) written out (torchvision is not installed);
- the model: a small LeNet-like net (``--model LeNet``, found by ``eval`` as there);
- the sizes, scaled to 1400 samples: ``--bs 32``, autoscaled up to 128 with local batches
  within (8, 64) (there 128, 4096 and (32, 1024) for 50,000);
- the two mixed-precision calls spelled the device-generic way torch now asks for,
  ``torch.amp.GradScaler(device)`` and ``torch.autocast(device, dtype=torch.float16)``
  (``torch.cuda.amp.GradScaler`` disables itself without CUDA, which would test nothing);
- both ranks' TensorBoard files go under ``ADAPTDL_TENSORBOARD_LOGDIR`` (the example puts
  rank 1's in /tmp);
- the test's hooks: ``--kill-in-epoch`` (replica 1 SIGKILLs itself mid-epoch, once) and
  ``--out`` (the last validation accuracy, the batch sizes, the gain and the scale).
"""

CIFAR = r'''
"""Train CIFAR10 with PyTorch (AdaptDL's example, on digits)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.distributed as dist

import argparse
import json
import os
import signal

from sklearn.datasets import load_digits

import adaptdl
import adaptdl.torch as adl

from torch.optim.lr_scheduler import MultiStepLR
from torch.utils.tensorboard import SummaryWriter


parser = argparse.ArgumentParser(description='PyTorch CIFAR10 Training')
parser.add_argument('--bs', default=32, type=int, help='batch size')
parser.add_argument('--lr', default=0.1, type=float, help='learning rate')
parser.add_argument('--epochs', default=60, type=int, help='number of epochs')
parser.add_argument('--model', default='LeNet', type=str, help='model')
parser.add_argument('--autoscale-bsz', dest='autoscale_bsz', default=False,
                    action='store_true', help='autoscale batchsize')
parser.add_argument('--mixed-precision', dest='mixed_precision', default=False,
                    action='store_true', help='use automatic mixed precision')
parser.add_argument('--kill-in-epoch', type=int, default=-1)
parser.add_argument('--out', default='')
args = parser.parse_args()

device = 'cuda' if torch.cuda.is_available() else 'cpu'
torch.manual_seed(0)


# Data (CIFAR10's interface, on scikit-learn's digits)
class RandomCrop:
    def __init__(self, size, padding):
        self.size, self.padding = size, padding

    def __call__(self, img):
        img = F.pad(img, [self.padding] * 4)
        i, j = torch.randint(0, img.shape[1] - self.size + 1, (2,)).tolist()
        return img[:, i:i + self.size, j:j + self.size]


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def __call__(self, img):
        return (img - self.mean) / self.std


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class CIFAR10(torch.utils.data.Dataset):
    def __init__(self, root, train, download, transform):
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).div(16.0).unsqueeze(1).repeat(1, 3, 1, 1)
        labels = torch.tensor(digits.target)
        part = slice(0, 1400) if train else slice(1400, None)
        self.data, self.targets, self.transform = images[part], labels[part], transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.transform(self.data[index]), self.targets[index]


print('==> Preparing data..')
transform_train = Compose([
    RandomCrop(8, padding=1),
    Normalize((0.3, 0.3, 0.3), (0.4, 0.4, 0.4)),
])

transform_test = Compose([
    Normalize((0.3, 0.3, 0.3), (0.4, 0.4, 0.4)),
])

adaptdl.torch.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

if adaptdl.env.replica_rank() == 0:
    trainset = CIFAR10(root=adaptdl.env.share_path(), train=True, download=True, transform=transform_train)
    trainloader = adl.AdaptiveDataLoader(trainset, batch_size=args.bs, shuffle=True, num_workers=2, drop_last=True)
    dist.barrier()  # We use a barrier here so that non-master replicas would wait for master to download the data
else:
    dist.barrier()
    trainset = CIFAR10(root=adaptdl.env.share_path(), train=True, download=False, transform=transform_train)
    trainloader = adl.AdaptiveDataLoader(trainset, batch_size=args.bs, shuffle=True, num_workers=2, drop_last=True)

if args.autoscale_bsz:
    trainloader.autoscale_batch_size(128, local_bsz_bounds=(8, 64), gradient_accumulation=False)

validset = CIFAR10(root=adaptdl.env.share_path(), train=False, download=False, transform=transform_test)
validloader = adl.AdaptiveDataLoader(validset, batch_size=100, shuffle=False, num_workers=2)


# Model
class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


print('==> Building model..')
net = eval(args.model)()
net = net.to(device)

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD([{"params": [param]} for param in net.parameters()],
                      lr=args.lr, momentum=0.9, weight_decay=5e-4)
lr_scheduler = MultiStepLR(optimizer, [30, 45], 0.1)

if args.mixed_precision:
    scaler = torch.amp.GradScaler(device, enabled=True)
else:
    scaler = None
net = adl.AdaptiveDataParallel(net, optimizer, lr_scheduler, scaler)
print(f"replica {adaptdl.env.replica_rank()} of {adaptdl.env.num_replicas()} restart {adaptdl.env.num_restarts()} "
      f"starts at epoch {adl.finished_epochs()}", flush=True)


# Training
def train(epoch):
    print('\nEpoch: %d' % epoch)
    net.train()
    stats = adl.Accumulator()
    for batch_idx, (inputs, targets) in enumerate(trainloader):
        optimizer.zero_grad()
        if args.mixed_precision:
            inputs, targets = inputs.to(device), targets.to(device)
            with torch.autocast(device, dtype=torch.float16):
                outputs = net(inputs)
                loss = criterion(outputs, targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = net(inputs)
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
        if (args.kill_in_epoch == epoch and batch_idx == 1 and adaptdl.env.replica_rank() == 1
                and adaptdl.env.num_restarts() == 0):
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dies mid-epoch

        stats["loss_sum"] += loss.item() * targets.size(0)
        _, predicted = outputs.max(1)
        stats["total"] += targets.size(0)
        stats["correct"] += predicted.eq(targets).sum().item()

    trainloader.to_tensorboard(writer, epoch, tag_prefix="AdaptDL/Data/")
    net.to_tensorboard(writer, epoch, tag_prefix="AdaptDL/Model/")
    if args.mixed_precision:
        writer.add_scalar("MixedPrecision/scale", scaler.get_scale(), epoch)
    with stats.synchronized():
        stats["loss_avg"] = stats["loss_sum"] / stats["total"]
        stats["accuracy"] = stats["correct"] / stats["total"]
        writer.add_scalar("Loss/Train", stats["loss_avg"], epoch)
        writer.add_scalar("Accuracy/Train", stats["accuracy"], epoch)
        print("Train:", stats)


def valid(epoch):
    net.eval()
    stats = adl.Accumulator()
    with torch.no_grad():
        for inputs, targets in validloader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = net(inputs)
            loss = criterion(outputs, targets)

            stats["loss_sum"] += loss.item() * targets.size(0)
            _, predicted = outputs.max(1)
            stats["total"] += targets.size(0)
            stats["correct"] += predicted.eq(targets).sum().item()

    with stats.synchronized():
        stats["loss_avg"] = stats["loss_sum"] / stats["total"]
        stats["accuracy"] = stats["correct"] / stats["total"]
        writer.add_scalar("Loss/Valid", stats["loss_avg"], epoch)
        writer.add_scalar("Accuracy/Valid", stats["accuracy"], epoch)
        print("Valid:", stats)
        results.append(stats["accuracy"])


results, sizes = [], []
tensorboard_dir = os.path.join(os.getenv("ADAPTDL_TENSORBOARD_LOGDIR", "/tmp"), adaptdl.env.job_id())
with SummaryWriter(tensorboard_dir) as writer:
    for epoch in adl.remaining_epochs_until(args.epochs):
        train(epoch)
        sizes.append(trainloader.current_batch_size)
        valid(epoch)
        lr_scheduler.step()

if args.out and adaptdl.env.replica_rank() == 0:
    with open(args.out, "w") as f:
        json.dump({"accuracy": results[-1], "sizes": sizes, "gain": net.gain,
                   "scale": scaler.get_scale() if scaler is not None else None}, f)
'''
