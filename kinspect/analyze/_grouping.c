/* The analyze job's grouping kernels in C: kinspect.analyze.groups.first_seen and
 * kinspect.analyze.partials' histogram sums, each beside its Python reference.
 *
 * first_seen: the job groups rows by one packed int64 key per row (kinspect/analyze/groups.py).
 * Arrow's dictionary_encode gives the same ids, but costs about 110 ns a row once a piece
 * holds a few hundred thousand distinct keys (the `values` merge); this open-addressing
 * table costs about a third of that.
 *
 * list_sums: the `integers` aggregate sums each group's varint histograms (lists of up to 10
 * counts) element by element. numpy needs a per-count index built by np.repeat first (2M
 * counts a piece: 20 ms of 34); one pass over the lists here needs none.
 *
 * accumulate_codes: a key column's codes (its value's offset from the column's lowest, or a
 * dictionary index, plus one; null 0) folded into the packed key in one pass over Arrow's own
 * buffers, where numpy made five (fill the nulls, convert, widen, add one, multiply and add).
 *
 * sort_int64: the `values` aggregate counts its packed keys (most of them distinct) by sorting
 * them. numpy's sort of int64 is a comparison sort on this machine's processors (about 54 ns a
 * key for 1.5M keys); a least-significant-digit radix sort of the keys' offsets from their
 * minimum takes a pass per 11 bits of their range (a packed key spans 30 to 40 bits).
 *
 * reduce_groups: each group's sums, minima, maxima of integer columns, and its rows where a
 * condition holds, over the rows chosen (valid, and where the condition holds). numpy needed
 * each column widened, its nulls filled, a mask of the rows chosen, the column multiplied by it,
 * a ufunc.at and a bincount of the mask for the groups left empty: six passes and four
 * temporary arrays for each of the 16 reductions of an `exchanges` piece. Here all of them are
 * one call, a loop each over Arrow's own buffers.
 *
 * tests/analyze/test_grouping_native.py checks each against its Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t key;
    int64_t id; /* -1: empty */
} Slot;

/* murmur3's 64-bit finalizer: packed keys are often runs of neighbours, which a plain
 * multiplication would still spread, but keys chosen to collide would not be */
static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static Slot *empty_table(size_t capacity) {
    Slot *table = malloc(capacity * sizeof(Slot));
    if (table != NULL) {
        for (size_t i = 0; i < capacity; i++) {
            table[i].id = -1;
        }
    }
    return table;
}

/* The table at twice the capacity, every key moved over; NULL (the old one freed) when out of memory. */
static Slot *grown(Slot *table, size_t capacity) {
    size_t larger = capacity * 2, mask = larger - 1;
    Slot *moved = empty_table(larger);
    if (moved != NULL) {
        for (size_t i = 0; i < capacity; i++) {
            if (table[i].id >= 0) {
                size_t at = mix((uint64_t)table[i].key) & mask;
                while (moved[at].id >= 0) {
                    at = (at + 1) & mask;
                }
                moved[at] = table[i];
            }
        }
    }
    free(table);
    return moved;
}

/* Fills ids[r] (each row's id) and first[i] (id i's first row); returns the number of ids, or -1
 * when out of memory. Runs without the GIL. */
static int64_t number_keys(const int64_t *keys, Py_ssize_t rows, int64_t *ids, int64_t *first) {
    size_t capacity = 1024, mask = capacity - 1;
    int64_t number = 0;
    Slot *table = empty_table(capacity);
    if (table == NULL) {
        return -1;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        int64_t key = keys[row];
        size_t at = mix((uint64_t)key) & mask;
        for (;;) {
            Slot *slot = &table[at];
            if (slot->id < 0) {
                slot->key = key;
                slot->id = number;
                first[number] = row;
                ids[row] = number++;
                if ((size_t)number * 2 > capacity) { /* at most half full: short probes */
                    table = grown(table, capacity);
                    if (table == NULL) {
                        return -1;
                    }
                    capacity *= 2;
                    mask = capacity - 1;
                }
                break;
            }
            if (slot->key == key) {
                ids[row] = slot->id;
                break;
            }
            at = (at + 1) & mask;
        }
    }
    free(table);
    return number;
}

static int writable_int64s(Py_buffer *view, Py_ssize_t rows, const char *name) {
    if (view->len < rows * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "first_seen: %s holds fewer than %zd int64s", name, rows);
        return 0;
    }
    return 1;
}

static PyObject *first_seen(PyObject *module, PyObject *args) {
    Py_buffer keys, ids, first;
    if (!PyArg_ParseTuple(args, "y*w*w*", &keys, &ids, &first)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t rows = keys.len / (Py_ssize_t)sizeof(int64_t);
    if (keys.len % (Py_ssize_t)sizeof(int64_t) != 0) {
        PyErr_SetString(PyExc_ValueError, "first_seen: keys are not a whole number of int64s");
    } else if (writable_int64s(&ids, rows, "ids") && writable_int64s(&first, rows, "first")) {
        int64_t number;
        Py_BEGIN_ALLOW_THREADS
        number = number_keys((const int64_t *)keys.buf, rows, (int64_t *)ids.buf, (int64_t *)first.buf);
        Py_END_ALLOW_THREADS
        result = number < 0 ? PyErr_NoMemory() : PyLong_FromLongLong(number);
    }
    PyBuffer_Release(&keys);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&first);
    return result;
}

/* sums[ids[i] * width + p] += values[offsets[i] + p] for each list i and each p below its
 * length and below width. */
static void add_lists(const int64_t *ids, const int64_t *offsets, Py_ssize_t lists, const int64_t *values,
                      int64_t width, int64_t *sums) {
    for (Py_ssize_t i = 0; i < lists; i++) {
        int64_t start = offsets[i], length = offsets[i + 1] - start;
        int64_t *row = sums + ids[i] * width;
        const int64_t *counts = values + start;
        if (length > width) {
            length = width;
        }
        for (int64_t p = 0; p < length; p++) {
            row[p] += counts[p];
        }
    }
}

static PyObject *list_sums(PyObject *module, PyObject *args) {
    Py_buffer ids, offsets, values, sums;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*y*y*nw*", &ids, &offsets, &values, &width, &sums)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t lists = ids.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t counts = values.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t cells = sums.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *group = ids.buf, *offset = offsets.buf;
    int ok = width > 0 && offsets.len == (lists + 1) * (Py_ssize_t)sizeof(int64_t);
    /* every offset within the values and never decreasing, every id within the sums: checked
     * before anything is added, so a bad call changes nothing */
    for (Py_ssize_t i = 0; ok && i < lists; i++) {
        ok = offset[i] >= 0 && offset[i] <= offset[i + 1] && offset[i + 1] <= counts && group[i] >= 0 &&
             group[i] < cells / width;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "list_sums: offsets must be one more than ids, ascending within the values, and every id "
                        "a row of sums");
    } else {
        Py_BEGIN_ALLOW_THREADS
        add_lists(group, offset, lists, (const int64_t *)values.buf, width, (int64_t *)sums.buf);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&ids);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&values);
    PyBuffer_Release(&sums);
    return result;
}

/* key[r] = code (first) or key[r] * span + code, code = values[r] - low + 1 where valid, else null_code */
#define ACCUMULATE(type)                                                                                  \
    static void accumulate_##type(int64_t *key, const type *values, Py_ssize_t rows, const uint8_t *valid,  \
                                  Py_ssize_t bit, int64_t low, int64_t span, int64_t null_code, int first) { \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                           \
            int64_t code = (int64_t)values[r] - low + 1;                                                  \
            if (valid != NULL && !((valid[(bit + r) >> 3] >> ((bit + r) & 7)) & 1)) {                      \
                code = null_code;                                                                         \
            }                                                                                             \
            key[r] = first ? code : key[r] * span + code;                                                 \
        }                                                                                                 \
    }
ACCUMULATE(int8_t)
ACCUMULATE(int16_t)
ACCUMULATE(int32_t)
ACCUMULATE(int64_t)
ACCUMULATE(uint8_t)
ACCUMULATE(uint16_t)
ACCUMULATE(uint32_t)

static PyObject *accumulate_codes(PyObject *module, PyObject *args) {
    Py_buffer key, values, validity;
    Py_ssize_t itemsize, bit;
    int is_signed, first;
    long long low, span, null_code;
    if (!PyArg_ParseTuple(args, "w*y*npy*nLLLp", &key, &values, &itemsize, &is_signed, &validity, &bit, &low, &span,
                          &null_code, &first)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t rows = key.len / (Py_ssize_t)sizeof(int64_t);
    int width_ok = itemsize == 1 || itemsize == 2 || itemsize == 4 || (itemsize == 8 && is_signed);
    /* every buffer long enough, checked before anything is written: a bad call changes nothing */
    if (key.len % (Py_ssize_t)sizeof(int64_t) != 0 || !width_ok || values.len < rows * itemsize || bit < 0 ||
        (validity.len > 0 && validity.len * 8 < bit + rows) || span < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "accumulate_codes: key must be int64s, values as many items of 1, 2 or 4 bytes (or 8, "
                        "signed), the validity bitmap (or empty) cover them from its bit offset, and span be at "
                        "least 1");
    } else {
        const uint8_t *valid = validity.len > 0 ? (const uint8_t *)validity.buf : NULL;
        int64_t *out = (int64_t *)key.buf;
        Py_BEGIN_ALLOW_THREADS
        switch (itemsize * (is_signed ? 1 : -1)) {
        case 1: accumulate_int8_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case 2: accumulate_int16_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case 4: accumulate_int32_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case 8: accumulate_int64_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case -1: accumulate_uint8_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        case -2: accumulate_uint16_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        default: accumulate_uint32_t(out, values.buf, rows, valid, bit, low, span, null_code, first); break;
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&values);
    PyBuffer_Release(&validity);
    return result;
}

#define RADIX_BITS 11
#define RADIX_SIZE (1 << RADIX_BITS)

/* keys ascending, by their offsets from the least of them, RADIX_BITS at a time (a stable
 * counting pass each, between keys and scratch); a digit that every key shares is skipped.
 * 0 when out of memory (keys unchanged). */
static int radix_sort(int64_t *keys, int64_t *scratch, Py_ssize_t n) {
    if (n < 2) {
        return 1;
    }
    int64_t low = keys[0], high = keys[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        low = keys[i] < low ? keys[i] : low;
        high = keys[i] > high ? keys[i] : high;
    }
    uint64_t range = (uint64_t)high - (uint64_t)low; /* unsigned: no overflow for any two int64s */
    if (range == 0) {
        return 1;
    }
    int passes = (64 - __builtin_clzll(range) + RADIX_BITS - 1) / RADIX_BITS;
    Py_ssize_t (*counts)[RADIX_SIZE] = calloc((size_t)passes, sizeof *counts);
    if (counts == NULL) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* every pass's histogram in one read of the keys */
        uint64_t offset = (uint64_t)keys[i] - (uint64_t)low;
        for (int p = 0; p < passes; p++) {
            counts[p][(offset >> (p * RADIX_BITS)) & (RADIX_SIZE - 1)]++;
        }
    }
    int64_t *from = keys, *to = scratch;
    for (int p = 0; p < passes; p++) {
        Py_ssize_t *count = counts[p], total = 0;
        int shared = 0;
        for (int d = 0; d < RADIX_SIZE; d++) {
            shared |= count[d] == n;
            Py_ssize_t here = count[d];
            count[d] = total; /* where digit d's keys start */
            total += here;
        }
        if (shared) {
            continue;
        }
        int shift = p * RADIX_BITS;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t offset = (uint64_t)from[i] - (uint64_t)low;
            to[count[(offset >> shift) & (RADIX_SIZE - 1)]++] = from[i];
        }
        int64_t *swap = from;
        from = to;
        to = swap;
    }
    if (from != keys) {
        memcpy(keys, from, (size_t)n * sizeof(int64_t));
    }
    free(counts);
    return 1;
}

static PyObject *sort_int64(PyObject *module, PyObject *args) {
    Py_buffer keys, scratch;
    if (!PyArg_ParseTuple(args, "w*w*", &keys, &scratch)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = keys.len / (Py_ssize_t)sizeof(int64_t);
    if (keys.len % (Py_ssize_t)sizeof(int64_t) != 0 || scratch.len < keys.len) {
        PyErr_SetString(PyExc_ValueError, "sort_int64: keys must be int64s and scratch at least as long");
    } else {
        int ok;
        Py_BEGIN_ALLOW_THREADS
        ok = radix_sort((int64_t *)keys.buf, (int64_t *)scratch.buf, n);
        Py_END_ALLOW_THREADS
        result = ok ? Py_NewRef(Py_None) : PyErr_NoMemory();
    }
    PyBuffer_Release(&keys);
    PyBuffer_Release(&scratch);
    return result;
}

static inline int bit_at(const uint8_t *bits, Py_ssize_t i) {
    return (bits[i >> 3] >> (i & 7)) & 1;
}

enum { OP_SUM, OP_MIN, OP_MAX, OP_COUNT };

/* One reduction of reduce_groups: its operation, its values (kind: itemsize, negative for unsigned; none for a
 * count), and the rows it takes: valid (no validity bitmap: all), and where its condition holds (none: all;
 * a null condition does not hold). */
typedef struct {
    int op, kind, every;
    const void *values;
    const uint8_t *valid, *where, *where_valid;
    Py_ssize_t valid_bit, where_bit, where_valid_bit;
    int64_t start;
} Reduction;

/* 1 where row r is chosen: valid, and its condition holds (a NULL bitmap: every row) */
static inline int64_t chosen(const uint8_t *valid, Py_ssize_t valid_bit, const uint8_t *where, Py_ssize_t where_bit,
                             const uint8_t *where_valid, Py_ssize_t where_valid_bit, Py_ssize_t r) {
    int64_t m = 1; /* no && between the bits: a branch on a random bit is mispredicted half the time */
    if (valid != NULL) {
        m &= bit_at(valid, valid_bit + r);
    }
    if (where != NULL) {
        m &= bit_at(where, where_bit + r);
    }
    if (where_valid != NULL) {
        m &= bit_at(where_valid, where_valid_bit + r);
    }
    return m;
}

/* One reduction over every row, into out[g] (and seen[g] = 1 where group g has a chosen row, when seen is
 * given). Its fields are copied to locals and each case has its own loop: writes to out could alias a
 * Reduction's fields, which made the compiler reload them on every row (about twice numpy's time). A sum
 * wraps round as numpy's does (unsigned arithmetic: no undefined overflow); a row not chosen adds 0. */
/* a minimum (<) or maximum (>) without a branch on the values (a random comparison is mispredicted half the time) */
#define EXTREME(type, better)                                                                                       \
    for (Py_ssize_t r = 0; r < rows; r++) {                                                                         \
        int64_t m = every ? 1 : chosen(valid, vb, where, wb, where_valid, wvb, r);                                  \
        int64_t v = (int64_t)values[r], *o = out + ids[r];                                                          \
        *o = (m & (v better *o)) ? v : *o;                                                                          \
        if (seen != NULL) {                                                                                         \
            seen[ids[r]] |= (uint8_t)m;                                                                             \
        }                                                                                                           \
    }

#define REDUCE(type)                                                                                                \
    static void reduce_##type(const int64_t *restrict ids, Py_ssize_t rows, const Reduction *c,                     \
                              int64_t *restrict out, uint8_t *restrict seen) {                                      \
        const type *restrict values = c->values;                                                                    \
        const uint8_t *valid = c->valid, *where = c->where, *where_valid = c->where_valid;                           \
        Py_ssize_t vb = c->valid_bit, wb = c->where_bit, wvb = c->where_valid_bit;                                  \
        int op = c->op, every = c->every;                                                                           \
        if (every && op == OP_SUM) {                                                                             \
            for (Py_ssize_t r = 0; r < rows; r++) {                                                                 \
                out[ids[r]] = (int64_t)((uint64_t)out[ids[r]] + (uint64_t)(int64_t)values[r]);                      \
            }                                                                                                       \
        } else if (op == OP_SUM) {                                                                                  \
            for (Py_ssize_t r = 0; r < rows; r++) {                                                                 \
                int64_t m = chosen(valid, vb, where, wb, where_valid, wvb, r);                                      \
                out[ids[r]] = (int64_t)((uint64_t)out[ids[r]] + ((uint64_t)(int64_t)values[r] & (uint64_t)-m));     \
                if (seen != NULL) {                                                                                 \
                    seen[ids[r]] |= (uint8_t)m;                                                                     \
                }                                                                                                   \
            }                                                                                                       \
        } else if (op == OP_MIN) {                                                                                  \
            EXTREME(type, <)                                                                                        \
        } else {                                                                                                    \
            EXTREME(type, >)                                                                                        \
        }                                                                                                           \
    }
REDUCE(int8_t)
REDUCE(int16_t)
REDUCE(int32_t)
REDUCE(int64_t)
REDUCE(uint8_t)
REDUCE(uint16_t)
REDUCE(uint32_t)

static void count_rows(const int64_t *restrict ids, Py_ssize_t rows, const Reduction *c, int64_t *restrict out) {
    const uint8_t *valid = c->valid, *where = c->where, *where_valid = c->where_valid;
    Py_ssize_t vb = c->valid_bit, wb = c->where_bit, wvb = c->where_valid_bit;
    for (Py_ssize_t r = 0; r < rows; r++) {
        out[ids[r]] += chosen(valid, vb, where, wb, where_valid, wvb, r);
    }
}

/* Each reduction in turn over the rows: out and seen hold a row of `number` groups per reduction. */
static void reduce_rows(const int64_t *ids, Py_ssize_t rows, const Reduction *red, Py_ssize_t k, Py_ssize_t number,
                        int64_t *out, uint8_t *seen) {
    for (Py_ssize_t j = 0; j < k; j++) {
        const Reduction *c = red + j;
        int64_t *o = out + j * number;
        uint8_t *s = seen != NULL ? seen + j * number : NULL;
        switch (c->op == OP_COUNT ? 0 : c->kind) {
        case 0: count_rows(ids, rows, c, o); break;
        case 1: reduce_int8_t(ids, rows, c, o, s); break;
        case 2: reduce_int16_t(ids, rows, c, o, s); break;
        case 4: reduce_int32_t(ids, rows, c, o, s); break;
        case 8: reduce_int64_t(ids, rows, c, o, s); break;
        case -1: reduce_uint8_t(ids, rows, c, o, s); break;
        case -2: reduce_uint16_t(ids, rows, c, o, s); break;
        default: reduce_uint32_t(ids, rows, c, o, s); break;
        }
    }
}

/* A bitmap argument: empty means none (NULL); else it must cover bits offset .. offset + rows. */
static int bitmap_of(Py_buffer *view, Py_ssize_t offset, Py_ssize_t rows, const uint8_t **bits) {
    *bits = view->len > 0 ? (const uint8_t *)view->buf : NULL;
    return offset >= 0 && (view->len == 0 || view->len * 8 >= offset + rows);
}

#define VIEWS 4 /* buffers a reduction holds: values, validity, condition, condition's validity */

static PyObject *reduce_groups(PyObject *module, PyObject *args) {
    Py_buffer ids, out, seen;
    PyObject *specs;
    if (!PyArg_ParseTuple(args, "y*O!w*w*", &ids, &PyTuple_Type, &specs, &out, &seen)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(specs), held = 0;
    Py_ssize_t rows = ids.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t number = k > 0 ? out.len / (Py_ssize_t)sizeof(int64_t) / k : 0;
    Reduction *red = PyMem_Calloc(k > 0 ? (size_t)k : 1, sizeof(Reduction));
    Py_buffer *views = PyMem_Calloc(k > 0 ? (size_t)k * VIEWS : 1, sizeof(Py_buffer));
    int ok = red != NULL && views != NULL && k > 0 && ids.len % (Py_ssize_t)sizeof(int64_t) == 0 &&
             out.len == number * k * (Py_ssize_t)sizeof(int64_t) && (seen.len == 0 || seen.len == number * k);
    if (red == NULL || views == NULL) {
        PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; ok && j < k; j++) {
        Reduction *c = red + j;
        Py_buffer *v = views + j * VIEWS;
        Py_ssize_t itemsize;
        int is_signed;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(specs, j), "iy*npy*ny*ny*n", &c->op, &v[0], &itemsize, &is_signed,
                              &v[1], &c->valid_bit, &v[2], &c->where_bit, &v[3], &c->where_valid_bit)) {
            ok = 0;
            break;
        }
        held = j + 1;
        c->values = v[0].buf;
        c->kind = (int)itemsize * (is_signed ? 1 : -1);
        ok = c->op >= OP_SUM && c->op <= OP_COUNT && bitmap_of(&v[1], c->valid_bit, rows, &c->valid) &&
             bitmap_of(&v[2], c->where_bit, rows, &c->where) &&
             bitmap_of(&v[3], c->where_valid_bit, rows, &c->where_valid) &&
             (c->op == OP_COUNT || ((itemsize == 1 || itemsize == 2 || itemsize == 4 || (itemsize == 8 && is_signed)) &&
                                    v[0].len >= rows * itemsize));
        c->every = c->valid == NULL && c->where == NULL;
        c->start = c->op == OP_MIN ? INT64_MAX : c->op == OP_MAX ? INT64_MIN : 0;
    }
    const int64_t *group = ids.buf;
    /* every id a row of out: checked before anything is written, so a bad call changes nothing */
    for (Py_ssize_t r = 0; ok && r < rows; r++) {
        ok = group[r] >= 0 && group[r] < number;
    }
    if (!ok) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError,
                            "reduce_groups: ids must be int64s, each a column of out (reductions x groups int64s), "
                            "each reduction (op 0 to 3, values, itemsize, signed, validity, bit, where, where_bit, "
                            "where_validity, where_validity_bit) with values of 1, 2 or 4 bytes (or 8, signed) for "
                            "every row, each bitmap (or empty) covering the rows from its bit offset, and seen empty "
                            "or as long as out");
        }
    } else {
        int64_t *sums = (int64_t *)out.buf;
        uint8_t *flags = seen.len > 0 ? (uint8_t *)seen.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = 0; j < k; j++) {
            for (Py_ssize_t g = 0; g < number; g++) {
                sums[j * number + g] = red[j].start;
            }
        }
        if (flags != NULL) {
            memset(flags, 0, (size_t)(number * k));
        }
        reduce_rows(group, rows, red, k, number, sums, flags);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    for (Py_ssize_t j = 0; j < held * VIEWS; j++) {
        if (views[j].obj != NULL) {
            PyBuffer_Release(&views[j]);
        }
    }
    PyMem_Free(views);
    PyMem_Free(red);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&out);
    PyBuffer_Release(&seen);
    return result;
}

static PyMethodDef methods[] = {
    {"first_seen", first_seen, METH_VARARGS,
     "first_seen(keys, ids, first) -> number: each int64 key's id (dense, in the order keys first "
     "appear) into ids, each id's first row into first; C-contiguous int64 buffers of the keys' length"},
    {"list_sums", list_sums, METH_VARARGS,
     "list_sums(ids, offsets, values, width, sums): adds the first `width` counts of list i (values "
     "offsets[i] to offsets[i + 1]) into row ids[i] of sums (groups x width); int64 buffers"},
    {"accumulate_codes", accumulate_codes, METH_VARARGS,
     "accumulate_codes(key, values, itemsize, signed, validity, bit_offset, low, span, null_code, first): "
     "key[r] = code if first else key[r] * span + code, code = values[r] - low + 1 where the validity bitmap "
     "(empty: all valid) has bit bit_offset + r set, else null_code; key an int64 buffer"},
    {"sort_int64", sort_int64, METH_VARARGS,
     "sort_int64(keys, scratch): sorts the int64 buffer keys ascending in place (a radix sort), using "
     "scratch (an int64 buffer at least as long) as room"},
    {"reduce_groups", reduce_groups, METH_VARARGS,
     "reduce_groups(ids, reductions, out, seen): for each reduction j, a tuple (op, values, itemsize, signed, "
     "validity, bit, where, where_bit, where_validity, where_validity_bit), out[j, g] = the sum (op 0), minimum "
     "(1) or maximum (2) of the values of group g's chosen rows, or their number (3; values unread); a row is "
     "chosen where the validity bitmap and the condition bitmap `where` (null false) hold (an empty bitmap: "
     "every row); seen[j, g] = 1 where group g has a chosen row (seen empty: not written); ids int64s, out "
     "reductions x groups int64s (out[j, g]), seen as many bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kinspect.analyze._dense", "The analyze job's grouping kernels (kinspect.analyze.groups, .partials).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__grouping(void) {
    return PyModule_Create(&module);
}
