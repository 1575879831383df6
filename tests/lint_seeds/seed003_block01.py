from torch.utils.checkpoint import checkpoint, checkpoint_sequential

class MemoryEfficientTransformer(torch.nn.Module):
    def __init__(self, layers, use_checkpointing=True):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.use_checkpointing = use_checkpointing

    def forward(self, x):
        if self.use_checkpointing and self.training:
            # Checkpoint each layer
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False)
        else:
            for layer in self.layers:
                x = layer(x)
        return x


# For sequential models
def forward_with_checkpoint(model, x, chunks=4):
    """Checkpoint sequential model in chunks."""
    return checkpoint_sequential(model, chunks, x, use_reentrant=False)
