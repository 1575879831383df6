import torch.nn as nn

# Simple but not recommended for serious training
model = nn.DataParallel(model)
model = model.cuda()

# All GPUs process different batches, gradients averaged on GPU 0
outputs = model(inputs)
loss = criterion(outputs, targets)
loss.backward()
