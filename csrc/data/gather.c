#include "data/gather.h"

#include <string.h>

#include "core/alloc.h"

gt_status gt_fields_layout(gt_field *fields, size_t num_fields, size_t max_rows,
                           size_t *slot_bytes) {
    size_t offset = 0;
    for (size_t f = 0; f < num_fields; f++) {
        size_t row_bytes = fields[f].row_bytes;
        if (row_bytes != 0 && max_rows > (SIZE_MAX / 2) / row_bytes)
            return GT_FAIL(GT_ERR_VALUE, "batch_size: %zu rows of %zu bytes overflow a slot",
                           max_rows, row_bytes);
        size_t field_bytes = gt_align_up(max_rows * row_bytes);
        if (offset > SIZE_MAX / 2 - field_bytes)
            return GT_FAIL(GT_ERR_VALUE, "data: a batch slot of the %zu fields overflows size_t",
                           num_fields);
        fields[f].slot_offset = offset;
        offset += field_bytes;
    }
    *slot_bytes = offset;
    return GT_OK;
}

/* Rows of a few bytes (labels, token ids) copied with fixed-size moves the compiler inlines. */
#define GT_GATHER_SMALL_ROWS(type)                                                            \
    for (size_t k = 0; k < count; k++) {                                                      \
        type value;                                                                           \
        memcpy(&value, field->base + (ptrdiff_t)indices[k] * field->row_stride, sizeof value); \
        memcpy(dst + k * sizeof value, &value, sizeof value);                                 \
    }

/* One field whose rows are not packed: one copy per row. */
static void gather_rows_strided(const gt_field *field, const int64_t *indices, size_t count,
                                char *dst) {
    switch (field->row_bytes) {
    case 1: GT_GATHER_SMALL_ROWS(uint8_t) return;
    case 2: GT_GATHER_SMALL_ROWS(uint16_t) return;
    case 4: GT_GATHER_SMALL_ROWS(uint32_t) return;
    case 8: GT_GATHER_SMALL_ROWS(uint64_t) return;
    default: break;
    }
    for (size_t k = 0; k < count; k++)
        memcpy(dst + k * field->row_bytes,
               field->base + (ptrdiff_t)indices[k] * field->row_stride, field->row_bytes);
}

/* One field with packed rows: runs of consecutive indices become one copy each. */
static void gather_rows_packed(const gt_field *field, const int64_t *indices, size_t count,
                               char *dst) {
    size_t k = 0;
    while (k < count) {
        size_t run = 1;
        while (k + run < count && indices[k + run] == indices[k] + (int64_t)run)
            run++;
        if (run == 1 && field->row_bytes <= 8) {
            gather_rows_strided(field, indices + k, 1, dst + k * field->row_bytes);
        } else {
            memcpy(dst + k * field->row_bytes, field->base + (size_t)indices[k] * field->row_bytes,
                   run * field->row_bytes);
        }
        k += run;
    }
}

/* One ragged field: each row copied, then padded to the batch's longest row (rounded up to the
 * field's width_multiple; row_bytes was sized for the longest row rounded up the same way). */
static size_t gather_rows_ragged(const gt_field *field, const int64_t *indices, size_t count,
                                 char *dst) {
    size_t width = 0;
    for (size_t k = 0; k < count; k++) {
        size_t items = (size_t)(field->offsets[indices[k] + 1] - field->offsets[indices[k]]);
        width = items > width ? items : width;
    }
    if (field->width_multiple > 1 && width % field->width_multiple)
        width += field->width_multiple - width % field->width_multiple;
    size_t pitch = width * field->item_bytes;
    for (size_t k = 0; k < count; k++) {
        int64_t first = field->offsets[indices[k]];
        size_t items = (size_t)(field->offsets[indices[k] + 1] - first);
        char *row = dst + k * pitch;
        memcpy(row, field->base + (size_t)first * field->item_bytes, items * field->item_bytes);
        for (size_t i = items; i < width; i++)
            memcpy(row + i * field->item_bytes, field->pad, field->item_bytes);
    }
    return width;
}

size_t gt_gather_rows(const gt_field *fields, size_t num_fields, const int64_t *indices,
                      size_t count, char *slot, size_t *widths) {
    size_t bytes = 0;
    for (size_t f = 0; f < num_fields; f++) {
        const gt_field *field = &fields[f];
        char *dst = slot + field->slot_offset;
        widths[f] = 0;
        if (field->offsets) {
            widths[f] = gather_rows_ragged(field, indices, count, dst);
            bytes += count * widths[f] * field->item_bytes;
        } else if (field->row_bytes > 0) {
            if (field->row_stride == (ptrdiff_t)field->row_bytes)
                gather_rows_packed(field, indices, count, dst);
            else
                gather_rows_strided(field, indices, count, dst);
            bytes += count * field->row_bytes;
        }
    }
    return bytes;
}
