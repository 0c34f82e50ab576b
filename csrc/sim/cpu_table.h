/* The CPU's table of core/device_backend.h (cpu_table.c): host memory, copies at once, streams
 * and events whose work is done when queued, the step's kernels as the CPU loops. */
#ifndef GT_CPU_TABLE_H
#define GT_CPU_TABLE_H

/* Registers the CPU's table for GT_DEVICE_CPU (module start-up; idempotent). */
void gt_cpu_device_install(void);

#endif
