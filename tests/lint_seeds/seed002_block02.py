from torch.utils.data import Dataset, DataLoader, DistributedSampler

class TokenStreamDataset(Dataset):
    def __init__(self, tensor_data, block_size):
        self.data = tensor_data
        self.block_size = block_size
    def __len__(self):
        return len(self.data) - self.block_size - 1
    def __getitem__(self, i):
        x = self.data[i:i+self.block_size]
        y = self.data[i+1:i+1+self.block_size]
        return x, y

train_ds = TokenStreamDataset(train_stream, BLOCK_SIZE)
val_ds   = TokenStreamDataset(val_stream, BLOCK_SIZE)

train_sampler = DistributedSampler(train_ds, shuffle=True, drop_last=True)
val_sampler   = DistributedSampler(val_ds,   shuffle=False, drop_last=False)

train_loader = DataLoader(train_ds, batch_size=micro_bs, sampler=train_sampler, num_workers=4, pin_memory=True)
val_loader   = DataLoader(val_ds,   batch_size=micro_bs, sampler=val_sampler,   num_workers=4, pin_memory=True)
