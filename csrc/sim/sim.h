/* The simulated device "sim" (DESIGN.md, "A backend is one interface"): host memory with a
 * GPU's semantics, so the device code path of nn/, train/ and data/ runs on every machine.
 * Memory: sim_memory.h; streams and events: sim_stream.h; the op table: sim_ops.h; the training
 * step's kernels: sim_kernels.h; the collectives: sim_comm.h. This file registers them as
 * core/device_backend.h's table. */
#ifndef GT_SIM_H
#define GT_SIM_H

/* Registers the sim table for GT_DEVICE_SIM (module start-up; idempotent). */
void gt_sim_install(void);

#endif
