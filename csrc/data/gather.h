/* Gathering dataset rows into a batch buffer: one memcpy per row, or one per run of
 * consecutive rows when the field's rows are packed (stride == row bytes). */
#ifndef GT_DATA_GATHER_H
#define GT_DATA_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One array of the dataset as seen by the gather: rows of `row_bytes` contiguous bytes,
 * `row_stride` bytes apart (any sign, 0 for a broadcast row, smaller than row_bytes for
 * overlapping windows over one flat token array). */
typedef struct gt_field {
    const char *base;        /* address of row 0 */
    ptrdiff_t row_stride;    /* bytes from row i to row i + 1 */
    size_t row_bytes;        /* bytes of one row (itemsize x product of the trailing shape) */
    size_t slot_offset;      /* byte offset of this field's rows inside a batch slot */
} gt_field;

/* Lays out `num_fields` fields in a slot holding up to `max_rows` rows of each: sets every
 * slot_offset (each GT_ALIGN-aligned) and writes the slot size in bytes to `slot_bytes`. */
gt_status gt_fields_layout(gt_field *fields, size_t num_fields, size_t max_rows,
                           size_t *slot_bytes);

/* Copies rows `indices[0..count)` of every field into `slot`, row k of field f landing at
 * slot + f.slot_offset + k * f.row_bytes. Indices must be in range (checked by the sampler). */
void gt_gather_rows(const gt_field *fields, size_t num_fields, const int64_t *indices,
                    size_t count, char *slot);

#ifdef __cplusplus
}
#endif
#endif
