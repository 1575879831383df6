from torch.distributed.fsdp import StateDictType, FullStateDictConfig
from torch.distributed.checkpoint import save_state_dict, load_state_dict

def save_fsdp_checkpoint(model, optimizer, path):
    """Save FSDP checkpoint efficiently."""

    # Sharded state dict (saves memory)
    with FSDP.state_dict_type(
        model,
        StateDictType.SHARDED_STATE_DICT,
    ):
        state_dict = {
            "model": model.state_dict(),
            "optimizer": FSDP.optim_state_dict(model, optimizer),
        }

        save_state_dict(state_dict, checkpoint_id=path)


def load_fsdp_checkpoint(model, optimizer, path):
    """Load FSDP checkpoint."""

    with FSDP.state_dict_type(
        model,
        StateDictType.SHARDED_STATE_DICT,
    ):
        state_dict = {
            "model": model.state_dict(),
            "optimizer": FSDP.optim_state_dict(model, optimizer),
        }

        load_state_dict(state_dict, checkpoint_id=path)

        model.load_state_dict(state_dict["model"])
        FSDP.optim_state_dict_to_load(model, optimizer, state_dict["optimizer"])
