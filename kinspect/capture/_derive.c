/* A capture batch's derived columns in one C loop (kinspect.capture.batch.BatchBuilder._derived_python is the
 * reference: change both).
 *
 * Why C: the writer process builds every row the capture keeps, and this loop was its largest single part
 * (1.8 to 2.9 us a row of the recorded traffic in-process, against 0.3 for the zip of the plain columns), the rest
 * being Arrow's conversions and the Parquet encoding. It runs in the writer process, so the time it saves
 * is what that process took from the clients and the broker on a busy machine.
 *
 * derive(facts, req_tables, resp_tables, table_number, utf8_sizes, utf8_size, error_names, error_name,
 *        header_versions, response_header_version, produce, log_overhead)
 *   facts: list of EXCHANGE tuples (29 items, capture.facts.FIELDS); the dicts and callables are the
 *   builder's: its IntegerFieldColumns' tables by id and table_number, its client ids' UTF-8 sizes and
 *   _utf8_size, a cache of error names and error_name, a cache of flexible response header versions
 *   and response_header_version; produce: the Produce api key; log_overhead: a batch's offset and
 *   length bytes.
 * -> (columns, counters, tables): columns, a tuple of 14 lists in the order of batch._DERIVED (the
 *   last: each row's number of scans with integer counters); counters and tables, each such scan's
 *   counters and slot table number, in row order.
 *
 * As in the reference, what follows from an exchange's two sides alone is worked out again only when
 * a row's sides (or api) are not the previous row's; each row then adds what its header and sizes say.
 * Arithmetic on ints that fit a long long is done in C, anything else by Python's operators. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum {
    F_CLIENT_ID = 6, F_API_KEY = 7, F_SIZE = 12, F_HEADER_SIZE = 13, F_HEADER_TAG_BYTES = 15, F_HEADER_TAGS = 16,
    F_REQUEST_SIDE = 19, F_RESPONSE_HEADER_VERSION = 22, F_RESPONSE_SIZE = 23, F_RESPONSE_TAG_BYTES = 26,
    F_RESPONSE_HEADER_TAGS = 27, F_RESPONSE_SIDE = 28, F_COUNT = 29
};
enum {
    C_REQ_ERROR, C_RESP_ERROR, C_REQ_TAG_BYTES, C_RESP_TAG_BYTES, C_REQ_COMPACT, C_RESP_COMPACT, C_TAGGED, C_CODES,
    C_TOPICS, C_BATCHES, C_RECORDS, C_COMPRESSION, C_MAGICS, C_GROUPS, C_COUNT
};

static PyObject *s_request_body, *s_response_body, *s_request_header, *s_response_header, *s_empty, *empty_tuple;

typedef struct {
    PyObject *req_tables, *resp_tables, *table_number, *utf8_sizes, *utf8_size, *error_names, *error_name,
        *header_versions, *response_header_version, *produce, *log_overhead;
    /* Each location's last slot table and its number: an api's scans share one table, and a slot table's
     * number never changes (numbers are kept by content), so a run of one api looks it up once. The facts
     * hold the tables alive for the call, so the pointer cannot be another table's meanwhile. */
    PyObject *last_slots[2], *last_table[2];
} Context;

/* What the reference works out from a row's two sides; every pointer a reference of its own, or NULL. */
typedef struct {
    PyObject *req_error, *resp_error, *req_delta, *resp_delta, *req_stats, *resp_stats, *req_tag_bytes,
        *resp_tag_bytes, *req_table, *resp_table, *req_tagged, *resp_tagged, *codes, *magics, *topics,
        *compression, *batches, *records, *flexible_header;
    long groups;
} Sides;

static void sides_clear(Sides *s)
{
    PyObject **fields[] = {&s->req_error, &s->resp_error, &s->req_delta, &s->resp_delta, &s->req_stats,
                           &s->resp_stats, &s->req_tag_bytes, &s->resp_tag_bytes, &s->req_table, &s->resp_table,
                           &s->req_tagged, &s->resp_tagged, &s->codes, &s->magics, &s->topics, &s->compression,
                           &s->batches, &s->records, &s->flexible_header};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        Py_CLEAR(*fields[i]);
    s->groups = 0;
}

/* a + b (new reference): in C for ints that fit, else Python's +. */
static PyObject *add(PyObject *a, PyObject *b)
{
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        int oa, ob;
        long long x = PyLong_AsLongLongAndOverflow(a, &oa), y = PyLong_AsLongLongAndOverflow(b, &ob);
        if (!oa && !ob && !(x == -1 && PyErr_Occurred()) && !(y == -1 && PyErr_Occurred())
            && !((y > 0 && x > LLONG_MAX - y) || (y < 0 && x < LLONG_MIN - y)))
            return PyLong_FromLongLong(x + y);
        PyErr_Clear();
    }
    return PyNumber_Add(a, b);
}

static PyObject *add_long(PyObject *a, long b)
{
    PyObject *other = PyLong_FromLong(b);
    if (other == NULL)
        return NULL;
    PyObject *sum = add(a, other);
    Py_DECREF(other);
    return sum;
}

/* An item of a sequence unpacked into `count` values (borrowed into out); -1 with ValueError otherwise. */
static int unpack(PyObject *item, Py_ssize_t count, PyObject **out, PyObject **keep)
{
    PyObject *fast = PySequence_Fast(item, "cannot unpack a non-sequence");
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != count) {
        PyErr_Format(PyExc_ValueError, "expected %zd values to unpack, got %zd", count, PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = PySequence_Fast_GET_ITEM(fast, i);
    *keep = fast; /* holds the values: the caller releases it */
    return 0;
}

/* The next item of an iterator unpacked into `count` values (unpack): 1, or 0 at its end, -1 on failure. */
static int next_unpacked(PyObject *iter, Py_ssize_t count, PyObject **out, PyObject **keep)
{
    PyObject *item = PyIter_Next(iter);
    if (item == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int rc = unpack(item, count, out, keep);
    Py_DECREF(item);
    return rc < 0 ? -1 : 1;
}

/* tuple([(location, p, t, n, s, n is not None) for p, t, n, s in body_tags]) */
static PyObject *body_tagged(PyObject *body_tags, PyObject *location)
{
    PyObject *fast = PySequence_Fast(body_tags, "body tags must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *v[4], *keep;
        if (unpack(PySequence_Fast_GET_ITEM(fast, i), 4, v, &keep) < 0) {
            Py_CLEAR(out);
            break;
        }
        PyObject *entry = PyTuple_Pack(6, location, v[0], v[1], v[2], v[3], v[2] != Py_None ? Py_True : Py_False);
        Py_DECREF(keep);
        if (entry == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, entry);
    }
    Py_DECREF(fast);
    return out;
}

/* *tagged = body_tagged(body_tags, location) when there are body tags (else left as it is); -1 on failure. */
static int set_tagged(PyObject **tagged, PyObject *body_tags, PyObject *location)
{
    int any = PyObject_IsTrue(body_tags);
    if (any <= 0)
        return any;
    PyObject *out = body_tagged(body_tags, location);
    if (out == NULL)
        return -1;
    Py_XSETREF(*tagged, out);
    return 0;
}

/* Appends (location, "", tag, None, n, False) for tag, n in header_tags to out at *at. */
static int header_tagged(PyObject *header_tags, PyObject *location, PyObject *out, Py_ssize_t *at)
{
    PyObject *fast = PySequence_Fast(header_tags, "header tags must be a sequence");
    if (fast == NULL)
        return -1;
    for (Py_ssize_t i = 0, n = PySequence_Fast_GET_SIZE(fast); i < n; i++) {
        PyObject *v[2], *keep;
        if (unpack(PySequence_Fast_GET_ITEM(fast, i), 2, v, &keep) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        PyObject *entry = PyTuple_Pack(6, location, s_empty, v[0], Py_None, v[1], Py_False);
        Py_DECREF(keep);
        if (entry == NULL) {
            Py_DECREF(fast);
            return -1;
        }
        PyTuple_SET_ITEM(out, (*at)++, entry);
    }
    Py_DECREF(fast);
    return 0;
}

/* tuple(sorted(iterable)) */
static PyObject *sorted_tuple(PyObject *iterable)
{
    PyObject *list = PySequence_List(iterable);
    if (list == NULL || PyList_Sort(list) < 0) {
        Py_XDECREF(list);
        return NULL;
    }
    PyObject *out = PyList_AsTuple(list);
    Py_DECREF(list);
    return out;
}

/* The slot table number of a scan's slots: tables[id(slots)][1], else table_number(location, slots). */
static PyObject *table_lookup(Context *c, int location, PyObject *slots)
{
    PyObject *key = PyLong_FromVoidPtr(slots);
    if (key == NULL)
        return NULL;
    PyObject *hit = PyDict_GetItemWithError(location ? c->resp_tables : c->req_tables, key);
    Py_DECREF(key);
    if (hit != NULL)
        return PySequence_GetItem(hit, 1);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallFunction(c->table_number, "iO", location, slots);
}

/* table_lookup, remembered for the location's last slot table. */
static PyObject *table_of(Context *c, int location, PyObject *slots)
{
    if (slots == c->last_slots[location])
        return Py_NewRef(c->last_table[location]);
    PyObject *table = table_lookup(c, location, slots);
    if (table != NULL) {
        c->last_slots[location] = slots;
        Py_XSETREF(c->last_table[location], Py_NewRef(table));
    }
    return table;
}

/* A cached value of a one-argument function: cache[key], else cache[key] = function(key) (new reference). */
static PyObject *cached(PyObject *cache, PyObject *function, PyObject *key, PyObject *second)
{
    PyObject *hit = PyDict_GetItemWithError(cache, key);
    if (hit != NULL)
        return Py_NewRef(hit);
    if (PyErr_Occurred())
        return NULL;
    PyObject *value = second != NULL ? PyObject_CallFunctionObjArgs(function, key, second, NULL)
                                     : PyObject_CallOneArg(function, key);
    if (value != NULL && PyDict_SetItem(cache, key, value) < 0)
        Py_CLEAR(value);
    return value;
}

/* tuple(sorted({b[0] for s in summaries if s is not None for b in s})) */
static PyObject *distinct_magics(PyObject *summaries)
{
    if (PyTuple_CheckExact(summaries) && PyTuple_GET_SIZE(summaries) == 1) { /* one batch: most produce requests */
        PyObject *first = PyTuple_GET_ITEM(summaries, 0);
        if (PyTuple_CheckExact(first) && PyTuple_GET_SIZE(first) == 1 && PyTuple_CheckExact(PyTuple_GET_ITEM(first, 0))
            && PyTuple_GET_SIZE(PyTuple_GET_ITEM(first, 0)) > 0)
            return PyTuple_Pack(1, PyTuple_GET_ITEM(PyTuple_GET_ITEM(first, 0), 0));
    }
    PyObject *seen = PySet_New(NULL), *outer = NULL;
    if (seen == NULL || (outer = PyObject_GetIter(summaries)) == NULL)
        goto fail;
    PyObject *summary;
    while ((summary = PyIter_Next(outer)) != NULL) {
        if (summary != Py_None) {
            PyObject *inner = PyObject_GetIter(summary), *batch;
            if (inner == NULL) {
                Py_DECREF(summary);
                goto fail;
            }
            while ((batch = PyIter_Next(inner)) != NULL) {
                PyObject *magic = PySequence_GetItem(batch, 0);
                Py_DECREF(batch);
                if (magic == NULL || PySet_Add(seen, magic) < 0) {
                    Py_XDECREF(magic);
                    break;
                }
                Py_DECREF(magic);
            }
            Py_DECREF(inner);
        }
        Py_DECREF(summary);
        if (PyErr_Occurred())
            goto fail;
    }
    if (PyErr_Occurred())
        goto fail;
    Py_DECREF(outer);
    PyObject *out = sorted_tuple(seen);
    Py_DECREF(seen);
    return out;
fail:
    Py_XDECREF(outer);
    Py_XDECREF(seen);
    return NULL;
}

/* The record summaries' batches, records and compression (Sides fields), as the reference sums them. */
static int summarize(Sides *s, PyObject *summaries, PyObject *log_overhead)
{
    PyObject *zero = PyLong_FromLong(0);
    s->batches = Py_NewRef(zero);
    s->records = Py_NewRef(zero);
    s->compression = Py_NewRef(empty_tuple);
    int truthy = summaries == NULL ? 0 : PyObject_IsTrue(summaries);
    if (truthy <= 0) {
        Py_DECREF(zero);
        return truthy;
    }
    Py_ssize_t n = PyObject_Length(summaries);
    if (n < 0)
        goto fail;
    if (n == 1) { /* one batch: most produce requests */
        PyObject *first = PySequence_GetItem(summaries, 0);
        if (first == NULL)
            goto fail;
        Py_ssize_t batches = first == Py_None ? -1 : PyObject_Length(first);
        if (batches == 1) {
            PyObject *batch = PySequence_GetItem(first, 0), *v[4], *keep;
            Py_DECREF(first);
            if (batch == NULL || unpack(batch, 4, v, &keep) < 0) {
                Py_XDECREF(batch);
                goto fail;
            }
            Py_DECREF(batch);
            int negative = PyObject_RichCompareBool(v[1], zero, Py_LT);
            PyObject *length = negative < 0 ? NULL : add(v[3], log_overhead);
            if (length == NULL) {
                Py_DECREF(keep);
                goto fail;
            }
            Py_SETREF(s->records, Py_NewRef(negative ? zero : v[1]));
            Py_SETREF(s->batches, PyLong_FromLong(1));
            PyObject *entry = PyTuple_Pack(4, v[2], s->batches, s->records, length);
            Py_DECREF(length);
            Py_DECREF(keep);
            if (entry == NULL)
                goto fail;
            Py_SETREF(s->compression, PyTuple_Pack(1, entry));
            Py_DECREF(entry);
            Py_DECREF(zero);
            return s->compression == NULL ? -1 : 0;
        }
        Py_DECREF(first);
        if (batches < 0 && PyErr_Occurred())
            goto fail;
    }
    /* Several batches: per compression, its batches, records and bytes. */
    PyObject *codecs = PyDict_New(), *outer = codecs == NULL ? NULL : PyObject_GetIter(summaries), *summary;
    if (outer == NULL) {
        Py_XDECREF(codecs);
        goto fail;
    }
    long batches = 0;
    while ((summary = PyIter_Next(outer)) != NULL) {
        PyObject *inner = summary == Py_None ? NULL : PyObject_GetIter(summary);
        Py_DECREF(summary);
        if (inner == NULL) {
            if (PyErr_Occurred())
                break;
            continue;
        }
        PyObject *v[4], *keep;
        while (next_unpacked(inner, 4, v, &keep) > 0) {
            batches++;
            PyObject *count = v[1];
            int negative = PyObject_RichCompareBool(count, zero, Py_LT);
            if (negative)
                count = zero;
            PyObject *acc = negative < 0 ? NULL : PyDict_GetItemWithError(codecs, v[2]);
            if (negative >= 0 && acc == NULL && !PyErr_Occurred()) {
                acc = Py_BuildValue("[OOO]", zero, zero, zero);
                if (acc != NULL && PyDict_SetItem(codecs, v[2], acc) < 0)
                    Py_CLEAR(acc);
                Py_XDECREF(acc); /* the dict holds it */
            }
            PyObject *total = acc == NULL ? NULL : add(s->records, count);
            PyObject *length = total == NULL ? NULL : add(v[3], log_overhead);
            PyObject *sums[3] = {NULL, NULL, NULL};
            if (length != NULL) {
                sums[0] = add_long(PyList_GET_ITEM(acc, 0), 1);
                sums[1] = sums[0] == NULL ? NULL : add(PyList_GET_ITEM(acc, 1), count);
                sums[2] = sums[1] == NULL ? NULL : add(PyList_GET_ITEM(acc, 2), length);
            }
            Py_DECREF(keep);
            Py_XDECREF(length);
            if (sums[2] == NULL) {
                Py_XDECREF(total);
                Py_XDECREF(sums[0]);
                Py_XDECREF(sums[1]);
                break;
            }
            Py_SETREF(s->records, total);
            for (int i = 0; i < 3; i++)
                PyList_SetItem(acc, i, sums[i]); /* steals */
        }
        Py_DECREF(inner);
        if (PyErr_Occurred())
            break;
    }
    Py_DECREF(outer);
    PyObject *keys = PyErr_Occurred() ? NULL : PyDict_Keys(codecs);
    if (keys == NULL || PyList_Sort(keys) < 0) {
        Py_XDECREF(keys);
        Py_DECREF(codecs);
        goto fail;
    }
    PyObject *compression = PyTuple_New(PyList_GET_SIZE(keys));
    for (Py_ssize_t i = 0; compression != NULL && i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *acc = PyDict_GetItem(codecs, key);
        PyObject *entry = PyTuple_Pack(4, key, PyList_GET_ITEM(acc, 0), PyList_GET_ITEM(acc, 1),
                                       PyList_GET_ITEM(acc, 2));
        if (entry == NULL)
            Py_CLEAR(compression);
        else
            PyTuple_SET_ITEM(compression, i, entry);
    }
    Py_DECREF(keys);
    Py_DECREF(codecs);
    if (compression == NULL)
        goto fail;
    Py_SETREF(s->compression, compression);
    Py_SETREF(s->batches, PyLong_FromLong(batches));
    Py_DECREF(zero);
    return s->batches == NULL ? -1 : 0;
fail:
    Py_DECREF(zero);
    return -1;
}

/* topics merged with a response's: a topic named by both directions counts the larger number of partitions
 * (new reference: a sorted tuple of (topic, partitions) items). */
static PyObject *merge_topics(PyObject *topics, PyObject *more)
{
    PyObject *merged = PyDict_New(), *iter = NULL;
    if (merged == NULL || PyDict_MergeFromSeq2(merged, topics, 1) < 0 || (iter = PyObject_GetIter(more)) == NULL)
        goto fail;
    PyObject *minus_one = PyLong_FromLong(-1);
    if (minus_one == NULL)
        goto fail;
    PyObject *v[2], *keep;
    while (next_unpacked(iter, 2, v, &keep) > 0) {
        PyObject *had = PyDict_GetItemWithError(merged, v[0]);
        int less = had == NULL && PyErr_Occurred() ? -1
                   : PyObject_RichCompareBool(had != NULL ? had : minus_one, v[1], Py_LT);
        if (less > 0 && PyDict_SetItem(merged, v[0], v[1]) < 0)
            less = -1;
        Py_DECREF(keep);
        if (less < 0)
            break;
    }
    Py_DECREF(minus_one);
    Py_CLEAR(iter);
    if (PyErr_Occurred())
        goto fail;
    PyObject *items = PyDict_Items(merged);
    Py_DECREF(merged);
    PyObject *out = items == NULL ? NULL : sorted_tuple(items);
    Py_XDECREF(items);
    return out;
fail:
    Py_XDECREF(iter);
    Py_XDECREF(merged);
    return NULL;
}

/* Everything that follows from a row's two sides (the reference's block under "if req is not last_req ..."). */
static int work_out_sides(Sides *s, Context *c, PyObject *api_key, PyObject *req, PyObject *side)
{
    PyObject *summaries = NULL, *keep = NULL;
    sides_clear(s);
    s->req_tagged = Py_NewRef(empty_tuple);
    s->resp_tagged = Py_NewRef(empty_tuple);
    s->codes = Py_NewRef(empty_tuple);
    s->magics = Py_NewRef(empty_tuple);
    if (PyTuple_CheckExact(req)) {
        PyObject *v[8];
        if (unpack(req, 8, v, &keep) < 0)
            return -1;
        /* req_tag_bytes, body_tags, req_delta, slots, req_stats, topics, _, summaries */
        s->req_tag_bytes = Py_NewRef(v[0]);
        s->req_delta = v[2] == Py_None ? NULL : Py_NewRef(v[2]);
        s->req_stats = v[4] == Py_None ? NULL : Py_NewRef(v[4]);
        s->topics = Py_NewRef(v[5]);
        summaries = Py_NewRef(v[7]);
        if (set_tagged(&s->req_tagged, v[1], s_request_body) < 0)
            goto fail;
        if (s->req_stats != NULL) {
            if ((s->req_table = table_of(c, 0, v[3])) == NULL)
                goto fail;
            s->groups = 1;
        }
        int any = PyObject_IsTrue(summaries);
        int produce = any > 0 ? PyObject_RichCompareBool(api_key, c->produce, Py_EQ) : 0;
        if (any < 0 || produce < 0)
            goto fail;
        if (produce) { /* distinct magics of the request's batches, ascending (0/1: KIP-724's removed formats) */
            PyObject *magics = distinct_magics(summaries);
            if (magics == NULL)
                goto fail;
            Py_SETREF(s->magics, magics);
        }
        Py_CLEAR(keep);
    } else {
        s->req_error = Py_NewRef(req);
    }
    if (PyTuple_CheckExact(side)) {
        PyObject *v[8];
        if (unpack(side, 8, v, &keep) < 0)
            goto fail;
        /* resp_tag_bytes, body_tags, resp_delta, slots, resp_stats, more, codes_seen, records */
        s->resp_tag_bytes = Py_NewRef(v[0]);
        s->resp_delta = v[2] == Py_None ? NULL : Py_NewRef(v[2]);
        s->resp_stats = v[4] == Py_None ? NULL : Py_NewRef(v[4]);
        if (set_tagged(&s->resp_tagged, v[1], s_response_body) < 0)
            goto fail;
        int any_codes = PyObject_IsTrue(v[6]);
        if (any_codes < 0)
            goto fail;
        if (any_codes) {
            PyObject *sorted = sorted_tuple(v[6]);
            PyObject *codes = sorted == NULL ? NULL : PyTuple_New(PyTuple_GET_SIZE(sorted));
            for (Py_ssize_t i = 0; codes != NULL && i < PyTuple_GET_SIZE(sorted); i++) {
                PyObject *cv[2], *ckeep, *name = NULL, *entry = NULL;
                if (unpack(PyTuple_GET_ITEM(sorted, i), 2, cv, &ckeep) == 0) {
                    name = cached(c->error_names, c->error_name, cv[0], NULL);
                    entry = name == NULL ? NULL : PyTuple_Pack(3, cv[0], name, cv[1]);
                    Py_XDECREF(name);
                    Py_DECREF(ckeep);
                }
                if (entry == NULL)
                    Py_CLEAR(codes);
                else
                    PyTuple_SET_ITEM(codes, i, entry);
            }
            Py_XDECREF(sorted);
            if (codes == NULL)
                goto fail;
            Py_SETREF(s->codes, codes);
        }
        if (s->resp_stats != NULL) {
            if ((s->resp_table = table_of(c, 1, v[3])) == NULL)
                goto fail;
            s->groups += 1;
        }
        PyObject *more = v[5];
        int any_more = PyObject_IsTrue(more);
        int differ = any_more > 0 ? PyObject_RichCompareBool(more, s->topics != NULL ? s->topics : Py_None, Py_NE) : 0;
        if (any_more < 0 || differ < 0)
            goto fail;
        if (differ) { /* the response often names what the request named */
            int had = s->topics == NULL ? 0 : PyObject_IsTrue(s->topics);
            if (had < 0)
                goto fail;
            PyObject *topics = had ? merge_topics(s->topics, more) : Py_NewRef(more);
            if (topics == NULL)
                goto fail;
            Py_XSETREF(s->topics, topics);
        }
        int any_records = PyObject_IsTrue(v[7]);
        if (any_records < 0)
            goto fail;
        if (any_records) {
            int had = summaries == NULL ? 0 : PyObject_IsTrue(summaries);
            PyObject *joined = had < 0 ? NULL : had ? PySequence_Concat(summaries, v[7]) : Py_NewRef(v[7]);
            if (joined == NULL)
                goto fail;
            Py_XSETREF(summaries, joined);
        }
        if (s->resp_delta != NULL
            && (s->flexible_header = cached(c->header_versions, c->response_header_version, api_key, Py_True)) == NULL)
            goto fail;
        Py_CLEAR(keep);
    } else if (side != Py_None) { /* None: no response */
        s->resp_error = Py_NewRef(side);
    }
    if (summarize(s, summaries, c->log_overhead) < 0)
        goto fail;
    Py_CLEAR(summaries);
    /* topics: () when there are none, else (topic, partitions) items by topic */
    int any_topics = s->topics == NULL ? 0 : PyObject_IsTrue(s->topics);
    if (any_topics < 0)
        goto fail;
    if (!any_topics) {
        Py_XSETREF(s->topics, Py_NewRef(empty_tuple));
    } else if (!PyTuple_CheckExact(s->topics) || PyTuple_GET_SIZE(s->topics) > 1) {
        PyObject *sorted = sorted_tuple(s->topics);
        if (sorted == NULL)
            goto fail;
        Py_SETREF(s->topics, sorted);
    }
    return 0;
fail:
    Py_XDECREF(keep);
    Py_XDECREF(summaries);
    return -1;
}

/* size + req_delta + 11 + client_id_size - header_size */
static PyObject *request_compact(PyObject *size, PyObject *delta, PyObject *client_id_size, PyObject *header_size)
{
    PyObject *terms[4] = {size, delta, client_id_size, header_size};
    long long v[4];
    int fits = 1;
    for (int i = 0; fits && i < 4; i++) {
        int overflow = 0;
        fits = PyLong_CheckExact(terms[i])
               && ((v[i] = PyLong_AsLongLongAndOverflow(terms[i], &overflow)) != -1 || !PyErr_Occurred())
               && !overflow && v[i] > -(1LL << 60) && v[i] < (1LL << 60);
    }
    if (fits) /* four terms under 2**60 in magnitude: no overflow */
        return PyLong_FromLongLong(v[0] + v[1] + 11 + v[2] - v[3]);
    PyErr_Clear();
    PyObject *a = add(size, delta), *b = a == NULL ? NULL : add_long(a, 11);
    PyObject *d = b == NULL ? NULL : add(b, client_id_size);
    PyObject *out = d == NULL ? NULL : PyNumber_Subtract(d, header_size);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(d);
    return out;
}

/* `if term: total += term` (term NULL: nothing); -1 on failure. */
static int add_truthy(PyObject **total, PyObject *term)
{
    int truthy = term == NULL ? 0 : PyObject_IsTrue(term);
    if (truthy <= 0)
        return truthy;
    PyObject *sum = add(*total, term);
    if (sum == NULL)
        return -1;
    Py_SETREF(*total, sum);
    return 0;
}

static Py_ssize_t truth_size(PyObject *tags, int *truthy)
{
    *truthy = tags == Py_None ? 0 : PyObject_IsTrue(tags);
    if (*truthy <= 0)
        return *truthy;
    return PyObject_Length(tags);
}

/* One row: what its own header and sizes add to its sides' values, appended to the columns. */
static int add_row(Sides *s, Context *c, PyObject *row, PyObject **columns, Py_ssize_t at_row, PyObject *counters,
                   PyObject *tables)
{
    PyObject *header_tags = PyTuple_GET_ITEM(row, F_HEADER_TAGS);
    PyObject *response_size = PyTuple_GET_ITEM(row, F_RESPONSE_SIZE);
    PyObject *response_header_tags = PyTuple_GET_ITEM(row, F_RESPONSE_HEADER_TAGS);
    int with_response = response_size != Py_None, header_truthy, response_truthy = 0;
    Py_ssize_t n_header = truth_size(header_tags, &header_truthy), n_response = 0;
    if (n_header < 0)
        return -1;
    if (with_response && (n_response = truth_size(response_header_tags, &response_truthy)) < 0)
        return -1;
    Py_ssize_t total = n_header + PyTuple_GET_SIZE(s->req_tagged)
                       + (with_response ? n_response + PyTuple_GET_SIZE(s->resp_tagged) : 0);
    PyObject *tagged = PyTuple_New(total);
    if (tagged == NULL)
        return -1;
    Py_ssize_t at = 0;
    if (header_truthy && header_tagged(header_tags, s_request_header, tagged, &at) < 0)
        goto fail_tagged;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s->req_tagged); i++)
        PyTuple_SET_ITEM(tagged, at++, Py_NewRef(PyTuple_GET_ITEM(s->req_tagged, i)));
    if (with_response) {
        if (response_truthy && header_tagged(response_header_tags, s_response_header, tagged, &at) < 0)
            goto fail_tagged;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s->resp_tagged); i++)
            PyTuple_SET_ITEM(tagged, at++, Py_NewRef(PyTuple_GET_ITEM(s->resp_tagged, i)));
    }
    if (at != total) { /* a sequence whose length and items disagree */
        PyErr_SetString(PyExc_ValueError, "derive: tags changed while read");
        goto fail_tagged;
    }

    PyObject *req_compact = Py_NewRef(Py_None), *resp_compact = Py_NewRef(Py_None);
    PyObject *header_tag_bytes = Py_NewRef(PyTuple_GET_ITEM(row, F_HEADER_TAG_BYTES));
    PyObject *response_tag_bytes = Py_NewRef(PyTuple_GET_ITEM(row, F_RESPONSE_TAG_BYTES));
    if (s->req_delta != NULL) { /* the header at its flexible version: ClientId keeps its int16 length, a tag section */
        PyObject *client_id = PyTuple_GET_ITEM(row, F_CLIENT_ID);
        PyObject *utf8 = PyDict_GetItemWithError(c->utf8_sizes, client_id);
        utf8 = utf8 != NULL ? Py_NewRef(utf8) : PyErr_Occurred() ? NULL : PyObject_CallOneArg(c->utf8_size, client_id);
        PyObject *compact = utf8 == NULL ? NULL : request_compact(PyTuple_GET_ITEM(row, F_SIZE), s->req_delta, utf8,
                                                                  PyTuple_GET_ITEM(row, F_HEADER_SIZE));
        Py_XDECREF(utf8);
        if (compact == NULL)
            goto fail;
        Py_SETREF(req_compact, compact);
    }
    if (s->req_stats != NULL && (PyList_Append(tables, s->req_table) < 0 || PyList_Append(counters, s->req_stats) < 0))
        goto fail;
    if (with_response) {
        if (add_truthy(&response_tag_bytes, s->resp_tag_bytes) < 0)
            goto fail;
        if (s->resp_delta != NULL) { /* v0 -> v1 at the flexible version: +1 tag byte */
            int more = PyObject_RichCompareBool(s->flexible_header, PyTuple_GET_ITEM(row, F_RESPONSE_HEADER_VERSION),
                                                Py_GT);
            PyObject *sum = more < 0 ? NULL : add(response_size, s->resp_delta);
            PyObject *compact = sum == NULL ? NULL : add_long(sum, more ? 1 : 0);
            Py_XDECREF(sum);
            if (compact == NULL)
                goto fail;
            Py_SETREF(resp_compact, compact);
        }
        if (s->resp_stats != NULL
            && (PyList_Append(tables, s->resp_table) < 0 || PyList_Append(counters, s->resp_stats) < 0))
            goto fail;
    }
    if (add_truthy(&header_tag_bytes, s->req_tag_bytes) < 0)
        goto fail;
    PyObject *values[C_COUNT] = {
        Py_NewRef(s->req_error != NULL ? s->req_error : Py_None),
        Py_NewRef(s->resp_error != NULL ? s->resp_error : Py_None),
        header_tag_bytes, response_tag_bytes, req_compact, resp_compact, tagged, Py_NewRef(s->codes),
        Py_NewRef(s->topics), Py_NewRef(s->batches), Py_NewRef(s->records), Py_NewRef(s->compression),
        Py_NewRef(s->magics), PyLong_FromLong(s->groups)};
    int rc = 0;
    for (int i = 0; i < C_COUNT; i++) { /* each column's list was made the batch's length: its item is set */
        if (values[i] == NULL)
            rc = -1;
        PyList_SET_ITEM(columns[i], at_row, values[i]);
    }
    return rc;
fail:
    Py_DECREF(req_compact);
    Py_DECREF(resp_compact);
    Py_DECREF(header_tag_bytes);
    Py_DECREF(response_tag_bytes);
fail_tagged:
    Py_DECREF(tagged);
    return -1;
}

static PyObject *derive(PyObject *module, PyObject *args)
{
    PyObject *facts;
    Context c;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!OO!OO!OOO:derive", &PyList_Type, &facts, &PyDict_Type, &c.req_tables,
                          &PyDict_Type, &c.resp_tables, &c.table_number, &PyDict_Type, &c.utf8_sizes, &c.utf8_size,
                          &PyDict_Type, &c.error_names, &c.error_name, &PyDict_Type, &c.header_versions,
                          &c.response_header_version, &c.produce, &c.log_overhead))
        return NULL;
    c.last_slots[0] = c.last_slots[1] = c.last_table[0] = c.last_table[1] = NULL;
    Py_ssize_t rows = PyList_GET_SIZE(facts);
    PyObject *columns[C_COUNT] = {NULL}, *counters = PyList_New(0), *tables = PyList_New(0), *out = NULL;
    PyObject *last_api = NULL, *last_req = NULL, *last_side = NULL;
    Sides s = {0};
    int ok = counters != NULL && tables != NULL;
    for (int i = 0; ok && i < C_COUNT; i++)
        ok = (columns[i] = PyList_New(rows)) != NULL; /* NULL items until set: freed as such on a failure */
    for (Py_ssize_t i = 0; ok && i < rows; i++) {
        if (i >= PyList_GET_SIZE(facts)) { /* a callback shortened the batch */
            PyErr_SetString(PyExc_RuntimeError, "derive: the facts changed while read");
            ok = 0;
            break;
        }
        PyObject *row = Py_NewRef(PyList_GET_ITEM(facts, i));
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != F_COUNT) {
            PyErr_Format(PyExc_ValueError, "derive: an exchange's facts are not a tuple of %d fields", F_COUNT);
            Py_DECREF(row);
            ok = 0;
            break;
        }
        PyObject *api_key = PyTuple_GET_ITEM(row, F_API_KEY), *req = PyTuple_GET_ITEM(row, F_REQUEST_SIDE);
        PyObject *side = PyTuple_GET_ITEM(row, F_RESPONSE_SIDE);
        int changed = req != last_req || side != last_side || last_api == NULL;
        if (!changed && api_key != last_api && (changed = PyObject_RichCompareBool(api_key, last_api, Py_NE)) < 0)
            ok = 0;
        if (ok && changed) {
            Py_XSETREF(last_api, Py_NewRef(api_key));
            Py_XSETREF(last_req, Py_NewRef(req));
            Py_XSETREF(last_side, Py_NewRef(side));
            ok = work_out_sides(&s, &c, api_key, req, side) == 0;
        }
        if (ok)
            ok = add_row(&s, &c, row, columns, i, counters, tables) == 0;
        Py_DECREF(row);
    }
    if (ok) {
        PyObject *tuple = PyTuple_New(C_COUNT);
        if (tuple != NULL) {
            for (int i = 0; i < C_COUNT; i++)
                PyTuple_SET_ITEM(tuple, i, Py_NewRef(columns[i]));
            out = PyTuple_Pack(3, tuple, counters, tables);
            Py_DECREF(tuple);
        }
    }
    sides_clear(&s);
    Py_XDECREF(c.last_table[0]);
    Py_XDECREF(c.last_table[1]);
    Py_XDECREF(last_api);
    Py_XDECREF(last_req);
    Py_XDECREF(last_side);
    for (int i = 0; i < C_COUNT; i++)
        Py_XDECREF(columns[i]);
    Py_XDECREF(counters);
    Py_XDECREF(tables);
    return out;
}

static PyMethodDef methods[] = {
    {"derive", derive, METH_VARARGS, "A capture batch's derived columns (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kinspect.capture._derive",
    "A capture batch's derived columns in one loop (capture.batch.BatchBuilder._derived_python is the reference).", -1,
    methods};

PyMODINIT_FUNC PyInit__derive(void)
{
    if ((s_request_body = PyUnicode_InternFromString("request_body")) == NULL
        || (s_response_body = PyUnicode_InternFromString("response_body")) == NULL
        || (s_request_header = PyUnicode_InternFromString("request_header")) == NULL
        || (s_response_header = PyUnicode_InternFromString("response_header")) == NULL
        || (s_empty = PyUnicode_InternFromString("")) == NULL || (empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
