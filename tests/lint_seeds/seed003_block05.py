from torch.distributed.fsdp import (
    FullyShardedDataParallel as FSDP,
    MixedPrecision,
    ShardingStrategy,
    CPUOffload,
)
from torch.distributed.fsdp.wrap import (
    transformer_auto_wrap_policy,
    size_based_auto_wrap_policy,
)
import functools

def create_fsdp_model(model, config):
    """Wrap model with FSDP for large model training."""

    # Mixed precision policy
    mp_policy = MixedPrecision(
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.bfloat16,
        buffer_dtype=torch.bfloat16,
    )

    # Auto-wrap policy for transformers
    auto_wrap_policy = functools.partial(
        transformer_auto_wrap_policy,
        transformer_layer_cls={
            torch.nn.TransformerEncoderLayer,
            # Add your transformer block class
        },
    )

    # Or size-based wrapping
    auto_wrap_policy = functools.partial(
        size_based_auto_wrap_policy,
        min_num_params=100_000_000,  # 100M params
    )

    # Wrap with FSDP
    model = FSDP(
        model,
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision=mp_policy,
        auto_wrap_policy=auto_wrap_policy,
        cpu_offload=CPUOffload(offload_params=False),  # Enable for very large models
        device_id=torch.cuda.current_device(),
    )

    return model


def train_fsdp():
    """Training loop with FSDP."""
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    model = create_model()
    model = create_fsdp_model(model, config)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    for epoch in range(num_epochs):
        for batch in train_loader:
            optimizer.zero_grad()

            with torch.autocast("cuda", dtype=torch.bfloat16):
                outputs = model(batch["input"].cuda())
                loss = criterion(outputs, batch["target"].cuda())

            loss.backward()
            optimizer.step()

    # Save full model (only on rank 0)
    if dist.get_rank() == 0:
        # Need to gather all shards
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
            state_dict = model.state_dict()
            torch.save(state_dict, "model.pt")

    dist.destroy_process_group()
