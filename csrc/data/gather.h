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

/* One array of the dataset as seen by the gather. Fixed rows: `row_bytes` contiguous bytes,
 * `row_stride` bytes apart (any sign, 0 for a broadcast row, smaller than row_bytes for
 * overlapping windows over one flat token array). Ragged rows (offsets != NULL): row i is
 * items offsets[i] .. offsets[i + 1] of `base`, each `item_bytes` long; a batch of them is
 * padded with `pad` to the width of its longest row, rounded up to a multiple of `width_multiple`. */
typedef struct gt_field {
    const char *base;        /* address of row 0, or of item 0 for ragged rows */
    ptrdiff_t row_stride;    /* bytes from row i to row i + 1 (fixed rows) */
    size_t row_bytes;        /* bytes of one row; for ragged rows max_items x item_bytes */
    const int64_t *offsets;  /* (rows + 1,) item offsets of ragged rows; NULL for fixed rows */
    size_t item_bytes;       /* bytes of one item of a ragged row */
    const char *pad;         /* (item_bytes,) the padding item of ragged rows */
    size_t width_multiple;   /* ragged rows: batch widths rounded up to a multiple of this (0 or 1: none) */
    size_t slot_offset;      /* byte offset of this field's rows inside a batch slot */
} gt_field;

/* Lays out `num_fields` fields in a slot holding up to `max_rows` rows of each: sets every
 * slot_offset (each GT_ALIGN-aligned) and writes the slot size in bytes to `slot_bytes`. */
gt_status gt_fields_layout(gt_field *fields, size_t num_fields, size_t max_rows,
                           size_t *slot_bytes);

/* Copies rows `indices[0..count)` of every field into `slot`, row k of field f landing at
 * slot + f.slot_offset + k * f.row_bytes (fixed rows) or k * widths[f] * f.item_bytes (ragged
 * rows, widths[f] = the batch's longest row in items rounded up to the field's width_multiple; 0
 * for fixed fields). Indices must be in
 * range (checked by the sampler). Returns the bytes written. */
size_t gt_gather_rows(const gt_field *fields, size_t num_fields, const int64_t *indices,
                      size_t count, char *slot, size_t *widths);

#ifdef __cplusplus
}
#endif
#endif
