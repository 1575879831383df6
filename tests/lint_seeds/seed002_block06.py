if is_main():
    torch.save({
        "model": model.module.state_dict(),  # unwrap DDP
        "opt": opt.state_dict(),
        "step": global_step,
        "config": {...},
    }, "ckpt.pt")
