"""Fails in step 2 with an error text holding ANSI colour codes and control characters, as torch's
`weights_only` load error and many CLI tools print them."""
import torch
import torch.nn as nn

model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(3, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 1:
        raise RuntimeError("\x1b[31mWeights only load failed.\x1b[0m\x07 Re-running `torch.load` with "
                           "\x1b[1mweights_only\x1b[0m set to `False` will likely succeed\x00")
