"""What cleanup must never touch: a root that is not safe to work in (roots), and a file in use
(inuse: open, mapped or held by the kernel, or possibly open in a process that cannot be inspected)."""
