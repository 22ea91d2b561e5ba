//! `fencecron-shim`: the run watchdog as a binary of its own (see
//! `fencecron::shim`). The daemon starts one per job; a small binary
//! starts in a fraction of the time the full `fencecron` needs (fewer
//! relocations and pages to map), which the fleet's lateness shows. When it
//! is not installed beside `fencecron`, the daemon runs `fencecron __shim`
//! instead, the same code.

fn main() {
    fencecron::shim::main(std::env::args_os().skip(1).collect());
}
