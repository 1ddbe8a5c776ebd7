"""AdaptDL's transformer language-model example (examples/transformer/transformer.py of
petuum/adaptdl, Apache-2.0, Copyright 2020 Petuum, Inc.), in its shape: the same
``TransformerModel`` and ``PositionalEncoding``, SGD with StepLR,
``AdaptiveDataParallel(model, optimizer, scheduler)``, gradient clipping at every step,
``model.gain`` to TensorBoard, the Accumulators and the epoch loop with the best model's
test at the end. What differs, so that it runs in seconds on a CPU without a download:
- the data: torchtext's WikiText2 and its legacy ``BPTTIterator`` (gone from torchtext
  0.12 on; AdaptDL's ``AdaptiveBPTTIterator`` is built on it, and raylight does not
  provide one) are replaced by a generated token stream (a Markov chain over 32 tokens:
  mostly a fixed successor, sometimes a random one) cut into ``bptt``-long windows, read
  through ``AdaptiveDataLoader(..., collate_fn=)``, whose batches have the iterator's
  ``.text`` and ``.target`` (``[bptt, batch]``); ``autoscale_batch_size`` is called where
  the iterator took ``max_batch_size``/``local_bsz_bounds``;
- the defaults: a small model (``--emsize 32 --nhid 64 --nlayers 1``), ``--bptt 16``,
  ``--bs 16``, local batches within (4, 32);
- small fixes for today's torch: ``scheduler.get_last_lr()`` (``get_lr()`` warns),
  ``enable_nested_tensor=False`` (which warns otherwise), the last test inside the
  ``SummaryWriter``'s block (it writes to it), ``best_model or model`` (a run restarted after
  its last epoch has none);
- ``evaluate`` also counts the next-token accuracy;
- the test's hooks: ``--kill-in-epoch`` (replica 1 SIGKILLs itself mid-epoch, once) and
  ``--out`` (the test accuracy and loss, the batch sizes and the gain).
"""

TRANSFORMER = r'''
import argparse
import collections
import json
import os
import signal
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.tensorboard import SummaryWriter

import adaptdl
import adaptdl.torch as adl


parser = argparse.ArgumentParser(description='PyTorch Transformer')
parser.add_argument('--bs', default=16, type=int, help='batch size')
parser.add_argument('--lr', default=5.0, type=float, help='learning rate')
parser.add_argument('--epochs', default=16, type=int, help='number of epochs')
parser.add_argument('--autoscale-bsz', dest='autoscale_bsz', default=False,
                    action='store_true', help='autoscale batchsize?')
parser.add_argument('--bptt', default=16, type=int, help='sequence length')
parser.add_argument('--emsize', default=32, type=int,
                    help='embedding dimension')
parser.add_argument('--nhid', default=64, type=int, help='the dimension of \
                    the feedforward network model in nn.TransformerEncoder')
parser.add_argument('--nlayers', default=1, type=int, help='the number of \
                    nn.TransformerEncoderLayer in nn.TransformerEncoder')
parser.add_argument('--nhead', default=2, type=int, help='the number of heads \
                    in the multiheadattention models')
parser.add_argument('--dropout', default=0.1, type=float,
                    help='the dropout value')
parser.add_argument('--kill-in-epoch', type=int, default=-1)
parser.add_argument('--out', default='')

args = parser.parse_args()
torch.manual_seed(0)


class TransformerModel(nn.Module):

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super(TransformerModel, self).__init__()
        from torch.nn import TransformerEncoder, TransformerEncoderLayer
        self.model_type = 'Transformer'
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        encoder_layers = TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers, enable_nested_tensor=False)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)

        self.init_weights()

    def _generate_square_subsequent_mask(self, sz):
        mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)
        mask = mask.float().masked_fill(mask == 0, float('-inf')).\
            masked_fill(mask == 1, float(0.0))
        return mask

    def init_weights(self):
        initrange = 0.1
        self.encoder.weight.data.uniform_(-initrange, initrange)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-initrange, initrange)

    def forward(self, src):
        if self.src_mask is None or self.src_mask.size(0) != len(src):
            device = src.device
            mask = self._generate_square_subsequent_mask(len(src)).to(device)
            self.src_mask = mask

        src = self.encoder(src) * np.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, self.src_mask)
        output = self.decoder(output)
        return output


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)

        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() *
                             (-np.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer('pe', pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


# The data: a generated token stream in bptt-long windows (WikiText2's stand-in).
Batch = collections.namedtuple("Batch", ["text", "target"])
NTOKENS = 32


class Windows(torch.utils.data.Dataset):
    def __init__(self, windows, bptt, seed):
        g = torch.Generator().manual_seed(seed)
        successor = torch.randperm(NTOKENS, generator=torch.Generator().manual_seed(7))
        stream = torch.empty(windows * bptt + 1, dtype=torch.long)
        stream[0] = 0
        noise = torch.rand(len(stream), generator=g) < 0.1
        random = torch.randint(0, NTOKENS, (len(stream),), generator=g)
        for i in range(1, len(stream)):
            stream[i] = random[i] if noise[i] else successor[stream[i - 1]]
        self.stream, self.bptt, self.windows = stream, bptt, windows

    def __len__(self):
        return self.windows

    def __getitem__(self, i):
        chunk = self.stream[i * self.bptt:(i + 1) * self.bptt + 1]
        return chunk[:-1], chunk[1:]


def bptt_batch(samples):
    return Batch(text=torch.stack([s[0] for s in samples]).t().contiguous(),
                 target=torch.stack([s[1] for s in samples]).t().contiguous())


train_txt, val_txt, test_txt = Windows(960, args.bptt, 1), Windows(96, args.bptt, 2), Windows(96, args.bptt, 3)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

batch_size = args.bs
eval_batch_size = args.bs

ntokens = NTOKENS  # the size of vocabulary
emsize = args.emsize  # embedding dimension
nhid = args.nhid  # dimension of feedforward network in nn.TransformerEncoder
nlayers = args.nlayers  # nn.TransformerEncoderLayer in nn.TransformerEncoder
nhead = args.nhead  # the number of heads in the multiheadattention models
dropout = args.dropout  # the dropout value

model = TransformerModel(ntokens, emsize, nhead,
                         nhid, nlayers, dropout).to(device)

criterion = nn.CrossEntropyLoss()
lr = args.lr
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)

best_val_loss = float("inf")
epochs = args.epochs
best_model = None

adaptdl.torch.init_process_group("nccl" if torch.cuda.is_available()
                                     else "gloo")

model = adl.AdaptiveDataParallel(model, optimizer, scheduler)
print(f"replica {adaptdl.env.replica_rank()} of {adaptdl.env.num_replicas()} restart {adaptdl.env.num_restarts()} "
      f"starts at epoch {adl.finished_epochs()}", flush=True)

if args.autoscale_bsz:
    max_batch_size = 1024 * batch_size
    local_bsz_bounds = (4, 32)
else:
    max_batch_size = None
    local_bsz_bounds = None

train_iter = adl.AdaptiveDataLoader(train_txt, batch_size=args.bs, shuffle=True, drop_last=True,
                                    collate_fn=bptt_batch)
if max_batch_size:
    train_iter.autoscale_batch_size(max_batch_size, local_bsz_bounds=local_bsz_bounds)

val_iter = adl.AdaptiveDataLoader(val_txt, batch_size=args.bs, collate_fn=bptt_batch)

test_iter = adl.AdaptiveDataLoader(test_txt, batch_size=args.bs, collate_fn=bptt_batch)


def train(train_iter, epoch):
    stats = adl.Accumulator()
    model.train()  # Turn on the train mode
    total_loss = 0.
    start_time = time.time()
    ntokens = NTOKENS
    for i, batch in enumerate(train_iter):
        optimizer.zero_grad()
        output = model(batch.text.to(device))
        loss = criterion(output.view(-1, ntokens),
                         batch.target.view(-1).to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        total_loss += loss.item()
        if (args.kill_in_epoch == epoch and i == 1 and adaptdl.env.replica_rank() == 1
                and adaptdl.env.num_restarts() == 0):
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dies mid-epoch

        stats["loss_sum"] += loss.item() * batch.target.size(1)  # noqa: E501 [bptt, batch]
        stats["total"] += batch.target.size(1)

        writer.add_scalar("Throughput/Gain", model.gain, epoch)

        log_interval = 100
        if i % log_interval == 0 and i > 0:
            cur_loss = total_loss / log_interval
            elapsed = time.time() - start_time
            print(f'| epoch {epoch:3d} | batch {i:5d} | '
                  f'lr {scheduler.get_last_lr()[0]:02.2f} | '
                  f'ms/batch {elapsed * 1000 / log_interval:7.2f} | '
                  f'loss {cur_loss:5.2f} | ppl {np.exp(cur_loss):8.2f}')
            total_loss = 0
            start_time = time.time()

    with stats.synchronized():
        stats["loss_avg"] = stats["loss_sum"] / stats["total"]
        writer.add_scalar("Loss/Train", stats["loss_avg"], epoch)
        print("Train:", stats)


def evaluate(eval_model, val_iter):
    eval_model.eval()  # Turn on the evaluation mode
    stats = adl.Accumulator()
    ntokens = NTOKENS
    with torch.no_grad():
        for batch in val_iter:
            output = eval_model(batch.text.to(device))
            output_flat = output.view(-1, ntokens)
            stats["loss_sum"] += batch.text.size(1) * \
                criterion(output_flat, batch.target.view(-1).to(device)).item()
            stats["total"] += batch.target.size(1)
            stats["correct"] += (output_flat.argmax(1) == batch.target.view(-1).to(device)).sum().item()
            stats["tokens"] += batch.target.numel()

    with stats.synchronized():
        loss_avg = stats["loss_avg"] = stats["loss_sum"] / stats["total"]
        accuracies.append(stats["correct"] / stats["tokens"])
        writer.add_scalar("Loss/Valid", stats["loss_avg"], epoch)
        print("Valid:", stats)

    return loss_avg


accuracies, sizes = [], []
tensorboard_dir = os.path.join(os.getenv("ADAPTDL_TENSORBOARD_LOGDIR", "/tmp"),
                               adaptdl.env.job_id())
with SummaryWriter(tensorboard_dir) as writer:
    for epoch in adl.remaining_epochs_until(args.epochs):
        epoch_start_time = time.time()
        train(train_iter, epoch)
        sizes.append(train_iter.current_batch_size)

        val_loss = evaluate(model, val_iter)
        print('-' * 89)
        print(f'| end of epoch {epoch:3d} '
              f'| time: {(time.time() - epoch_start_time):5.2f}s '
              f'| valid loss {val_loss:5.2f} '
              f'| valid ppl {np.exp(val_loss):8.2f}')
        print('-' * 89)

        if val_loss < best_val_loss:
            best_val_loss = val_loss
            best_model = model

        scheduler.step()

    test_loss = evaluate(best_model or model, test_iter)
print('=' * 89)
print(f'| End of training | test loss {test_loss:5.2f} | '
      f'test ppl {np.exp(test_loss):8.2f}')
print('=' * 89)
if args.out and adaptdl.env.replica_rank() == 0:
    with open(args.out, "w") as f:
        json.dump({"accuracy": accuracies[-1], "val_loss": test_loss, "sizes": sizes, "gain": model.gain}, f)
'''
