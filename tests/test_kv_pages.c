/*
 * test_kv_pages.c — the page manager: prefix hits and their limits, identity isolation, LRU
 * eviction order, twins, and a randomised run of 10^5 operations (admit, compute/append,
 * prefix hit, cancel, preempt, readmit, finish) with every invariant checked after each one,
 * also under a 2-bit hash that makes collisions the rule rather than the exception.
 *
 * The randomised test keeps a shadow of what each page would hold: when a page's 64 positions
 * are computed it records (uid, block index, a strong hash of the sequence's tokens up to the
 * page's end) — the identity of the K/V bytes a real backend would write there. After every
 * operation every full block of every live sequence must point at a page whose shadow is that
 * sequence's own prefix: a wrong prefix hit, a page reused while referenced or a collision
 * accepted without verification all break it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/kv_pages.h"
#include "tests/test.h"

#define P KV_PAGE_TOKENS

static void check_ok(const struct kv_pages *kp, const struct kv_seq *const *seqs, int64_t n)
{
	struct err e = {{0}};
	int rc = kv_pages_check(kp, seqs, n, &e);
	if (rc)
		test_fail(__FILE__, __LINE__, "invariant: %s", e.msg);
	REQUIRE(rc == 0);
}

static void fill(int32_t *t, int64_t n, int32_t base)
{
	for (int64_t i = 0; i < n; i++)
		t[i] = base + (int32_t)i;
}

TEST(kv_pages, prefix_hit_basics)
{
	struct kv_pages kp;
	REQUIRE(kv_pages_init(&kp, 16) == 0);
	int32_t tok[300];
	fill(tok, 300, 1000);
	struct kv_seq a = {0}, b = {0}, c = {0};
	a.uid = b.uid = 7;
	c.uid = 8;
	a.chain_page = b.chain_page = c.chain_page = -1;
	CHECK_EQ_INT(kv_pages_match(&kp, &a, tok, 300), 0);
	REQUIRE(kv_pages_reserve(&kp, &a, 300) == 0);
	CHECK_EQ_INT(a.n_blocks, 5);
	CHECK_EQ_INT(kv_pages_available(&kp), 11);
	kv_pages_publish(&kp, &a, tok, 200); /* 3 full pages computed */
	CHECK_EQ_INT(a.n_published, 3);
	const struct kv_seq *all[3] = {&a, &b, &c};
	check_ok(&kp, all, 1);

	/* Same uid, same tokens: 3 pages hit while a is live (shared, ref 2). */
	CHECK_EQ_INT(kv_pages_match(&kp, &b, tok, 300), 3 * P);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ_INT(b.bt[i], a.bt[i]);
		CHECK_EQ_INT(kp.ref[a.bt[i]], 2);
	}
	check_ok(&kp, all, 2);
	/* Another uid: no hit. */
	CHECK_EQ_INT(kv_pages_match(&kp, &c, tok, 300), 0);
	/* A different token inside page 1: only page 0 hits. */
	kv_pages_release(&kp, &b);
	int32_t tok2[300];
	memcpy(tok2, tok, sizeof tok);
	tok2[P + 5] = 3;
	CHECK_EQ_INT(kv_pages_match(&kp, &b, tok2, 300), P);
	kv_pages_release(&kp, &b);
	/* The cap: n tokens reuse at most (n - 1) / 64 pages. */
	CHECK_EQ_INT(kv_pages_match(&kp, &b, tok, 3 * P), 2 * P);
	kv_pages_release(&kp, &b);
	CHECK_EQ_INT(kv_pages_match(&kp, &b, tok, 3 * P + 1), 3 * P);
	kv_pages_release(&kp, &b);
	check_ok(&kp, all, 3);

	/* a finishes: its 3 published pages become cached, the other 2 free. */
	kv_pages_release(&kp, &a);
	CHECK_EQ_INT(kp.n_cached, 3);
	CHECK_EQ_INT(kp.n_free, 13);
	CHECK_EQ_INT(kv_pages_available(&kp), 16);
	int64_t hit, hit_cached;
	kv_pages_peek(&kp, 7, tok, 300, &hit, &hit_cached);
	CHECK_EQ_INT(hit, 3);
	CHECK_EQ_INT(hit_cached, 3);
	check_ok(&kp, all, 3);
	kv_seq_free(&a);
	kv_seq_free(&b);
	kv_seq_free(&c);
	kv_pages_free(&kp);
}

TEST(kv_pages, lru_evicts_oldest_and_deepest_first)
{
	struct kv_pages kp;
	REQUIRE(kv_pages_init(&kp, 6) == 0);
	int32_t x[3 * P + 1], y[3 * P + 1];
	fill(x, 3 * P + 1, 10);
	fill(y, 3 * P + 1, 5000);
	struct kv_seq a = {.uid = 1, .chain_page = -1}, b = {.uid = 1, .chain_page = -1};
	REQUIRE(kv_pages_reserve(&kp, &a, 3 * P) == 0);
	kv_pages_publish(&kp, &a, x, 3 * P);
	REQUIRE(kv_pages_reserve(&kp, &b, 3 * P) == 0);
	kv_pages_publish(&kp, &b, y, 3 * P);
	kv_pages_release(&kp, &a); /* x's pages enter the LRU first, deepest first */
	kv_pages_release(&kp, &b);
	CHECK_EQ_INT(kp.n_cached, 6);
	/* A new sequence takes 2 pages: x's pages 2 then 1 are evicted; x keeps page 0 only. */
	struct kv_seq c = {.uid = 2, .chain_page = -1};
	REQUIRE(kv_pages_reserve(&kp, &c, 2 * P) == 0);
	CHECK_EQ_INT(kp.n_evicted, 2);
	int64_t hit, hc;
	kv_pages_peek(&kp, 1, x, 3 * P + 1, &hit, &hc);
	CHECK_EQ_INT(hit, 1);
	kv_pages_peek(&kp, 1, y, 3 * P + 1, &hit, &hc);
	CHECK_EQ_INT(hit, 3);
	/* Reserve is all or nothing. */
	CHECK_EQ_INT(kv_pages_reserve(&kp, &c, 7 * P), -ENOMEM);
	CHECK_EQ_INT(c.n_blocks, 2);
	const struct kv_seq *all[1] = {&c};
	check_ok(&kp, all, 1);
	kv_seq_free(&a);
	kv_seq_free(&b);
	kv_seq_free(&c);
	kv_pages_free(&kp);
}

TEST(kv_pages, twins_chain_to_the_published_page)
{
	/* Two sequences compute the same prefix at once: one entry per page, and a third finds
	 * the whole chain even though the second's later pages chained off the first's. */
	struct kv_pages kp;
	REQUIRE(kv_pages_init(&kp, 16) == 0);
	int32_t t[4 * P + 1];
	fill(t, 4 * P + 1, 77);
	struct kv_seq a = {.uid = 3, .chain_page = -1}, b = {.uid = 3, .chain_page = -1},
		      c = {.uid = 3, .chain_page = -1};
	REQUIRE(kv_pages_reserve(&kp, &a, 2 * P) == 0);
	REQUIRE(kv_pages_reserve(&kp, &b, 4 * P) == 0);
	kv_pages_publish(&kp, &a, t, 2 * P);
	kv_pages_publish(&kp, &b, t, 4 * P); /* pages 0, 1 are twins of a's */
	CHECK_EQ_INT(kp.published[b.bt[0]] + kp.published[b.bt[1]], 0);
	CHECK_EQ_INT(kp.published[b.bt[2]] + kp.published[b.bt[3]], 2);
	CHECK_EQ_INT(kv_pages_match(&kp, &c, t, 4 * P + 1), 4 * P);
	CHECK_EQ_INT(c.bt[0], a.bt[0]);
	CHECK_EQ_INT(c.bt[2], b.bt[2]);
	const struct kv_seq *all[3] = {&a, &b, &c};
	check_ok(&kp, all, 3);
	kv_seq_free(&a);
	kv_seq_free(&b);
	kv_seq_free(&c);
	kv_pages_free(&kp);
}

TEST(kv_pages, parent_generation_guards_reuse)
{
	/* Every hash collides (mask 0). A child page outlives its parent (held by a twin); the
	 * parent's id is reused for other tokens and published again. A lookup that reaches the
	 * child through the reused id must miss: the child was computed after other tokens. */
	struct kv_pages kp;
	REQUIRE(kv_pages_init(&kp, 4) == 0);
	kp.hash_mask = 0;
	int32_t ab[2 * P + 1], xb[2 * P + 1];
	fill(ab, 2 * P + 1, 100);       /* pages A, B */
	memcpy(xb, ab, sizeof ab);
	xb[0] = 9;                      /* pages A', B */
	struct kv_seq a = {.uid = 1, .chain_page = -1}, b = {.uid = 1, .chain_page = -1},
		      c = {.uid = 1, .chain_page = -1}, d = {.uid = 1, .chain_page = -1};
	REQUIRE(kv_pages_reserve(&kp, &a, P) == 0);
	kv_pages_publish(&kp, &a, ab, P);         /* P = a.bt[0] stands for A */
	REQUIRE(kv_pages_reserve(&kp, &b, 2 * P) == 0);
	kv_pages_publish(&kp, &b, ab, 2 * P);     /* b's page 0 is a twin; C = b.bt[1], parent P */
	int32_t Ppage = a.bt[0], Cpage = b.bt[1];
	CHECK_EQ_INT(kp.parent[Cpage], Ppage);
	kv_pages_release(&kp, &a);                /* P cached; C still held by b */
	REQUIRE(kv_pages_reserve(&kp, &c, P) == 0); /* takes the last free page */
	kv_pages_release(&kp, &c);
	struct kv_seq e2 = {.uid = 1, .chain_page = -1};
	REQUIRE(kv_pages_reserve(&kp, &e2, 2 * P) == 0); /* evicts P and c's page */
	int32_t reused = e2.bt[0] == Ppage ? 0 : 1;
	CHECK_EQ_INT(e2.bt[reused], Ppage);
	/* publish P's id again, now standing for A' */
	if (reused == 0) {
		kv_pages_publish(&kp, &e2, xb, P);
	} else { /* make the reused id the sequence's first page */
		int32_t t = e2.bt[0];
		e2.bt[0] = e2.bt[1];
		e2.bt[1] = t;
		kv_pages_publish(&kp, &e2, xb, P);
	}
	CHECK_EQ_INT(kp.published[Ppage], 1);
	CHECK_EQ_INT(kv_pages_match(&kp, &d, xb, 2 * P + 1), P); /* A' hits, B must not */
	const struct kv_seq *all[3] = {&b, &e2, &d};
	check_ok(&kp, all, 3);
	kv_seq_free(&a);
	kv_seq_free(&b);
	kv_seq_free(&c);
	kv_seq_free(&d);
	kv_seq_free(&e2);
	kv_pages_free(&kp);
}

/* ---- randomised ---------------------------------------------------------------------------- */

enum { MAXT = 8 * P, NSEQ = 24, NPAGES = 40, NBASE = 4 };

struct rseq {
	int live, preempted;
	struct kv_seq kv;
	int32_t tok[MAXT];
	int64_t n_tokens, n_computed;
	uint64_t phash[MAXT / P]; /* strong hash of tok[0 .. 64 (b + 1)) with the uid */
};

struct shadow {
	int set;
	uint32_t uid;
	int64_t block;
	uint64_t phash;
};

struct world {
	struct kv_pages kp;
	struct rseq seq[NSEQ];
	struct shadow sh[NPAGES];
	int32_t base[NBASE][MAXT];
	uint64_t rng;
	int64_t hits, preempts, evicted_seen;
};

static uint64_t strong(uint64_t h, int32_t t)
{
	h ^= (uint32_t)t;
	h *= 0x100000001b3ull; /* FNV-1a step, then a different finaliser */
	return h ^ (h >> 29);
}

static void rehash(struct rseq *q)
{
	uint64_t h = 0xcbf29ce484222325ull ^ q->kv.uid;
	for (int64_t i = 0; i < q->n_tokens; i++) {
		h = strong(h, q->tok[i]);
		if ((i + 1) % P == 0)
			q->phash[i / P] = h;
	}
}

static void check_world(struct world *w)
{
	const struct kv_seq *all[NSEQ];
	int64_t n = 0;
	for (int i = 0; i < NSEQ; i++)
		if (w->seq[i].live)
			all[n++] = &w->seq[i].kv;
	check_ok(&w->kp, all, n);
	for (int i = 0; i < NSEQ; i++) {
		struct rseq *q = &w->seq[i];
		if (!q->live)
			continue;
		for (int64_t b = 0; (b + 1) * P <= q->n_computed; b++) {
			const struct shadow *s = &w->sh[q->kv.bt[b]];
			if (!s->set || s->uid != q->kv.uid || s->block != b || s->phash != q->phash[b]) {
				test_fail(__FILE__, __LINE__, "seq %d block %lld: page %d holds another prefix",
					  i, (long long)b, q->kv.bt[b]);
				test_abort_case();
			}
		}
	}
}

static int64_t rnd(struct world *w, int64_t n) { return (int64_t)(test_rand(&w->rng) % (uint64_t)n); }

/* Preempts the live, non-preempted sequence with the highest index other than keep (or keep
 * itself if it is the only one). Returns 0 if none. */
static int preempt_one(struct world *w, int keep)
{
	for (int pass = 0; pass < 2; pass++)
		for (int i = NSEQ - 1; i >= 0; i--) {
			struct rseq *q = &w->seq[i];
			if (!q->live || q->preempted || (pass == 0 && i == keep))
				continue;
			kv_pages_release(&w->kp, &q->kv);
			q->n_computed = 0;
			q->preempted = 1;
			w->preempts++;
			return 1;
		}
	return 0;
}

/* Computes up to n more positions of q (appending a token first if all are computed). */
static void compute(struct world *w, int i, int64_t n)
{
	struct rseq *q = &w->seq[i];
	if (q->n_computed == q->n_tokens) {
		if (q->n_tokens == MAXT) { /* full: finish */
			kv_pages_release(&w->kp, &q->kv);
			q->live = 0;
			return;
		}
		/* mostly follow a base text so later sequences share generated pages too */
		q->tok[q->n_tokens] = rnd(w, 4) ? w->base[0][q->n_tokens] : (int32_t)rnd(w, 50);
		q->n_tokens++;
		rehash(q);
	}
	int64_t rem = q->n_tokens - q->n_computed;
	n = n < rem ? n : rem;
	while (kv_pages_reserve(&w->kp, &q->kv, q->n_computed + n) < 0)
		REQUIRE(preempt_one(w, i));
	if (q->preempted) /* it preempted itself: impossible while others hold pages */
		return;
	for (int64_t p = q->n_computed; p < q->n_computed + n; p++)
		if ((p + 1) % P == 0) { /* the backend writes the page's last position */
			struct shadow *s = &w->sh[q->kv.bt[p / P]];
			s->set = 1;
			s->uid = q->kv.uid;
			s->block = p / P;
			s->phash = q->phash[p / P];
		}
	q->n_computed += n;
	kv_pages_publish(&w->kp, &q->kv, q->tok, q->n_computed);
}

static void admit(struct world *w, int i, int use_cache)
{
	struct rseq *q = &w->seq[i];
	if (use_cache) {
		int64_t hit = kv_pages_match(&w->kp, &q->kv, q->tok, q->n_tokens);
		REQUIRE(hit >= 0 && hit % P == 0 && hit < q->n_tokens);
		q->n_computed = hit;
		w->hits += hit / P;
	}
	q->live = 1;
	q->preempted = 0;
}

static void run_random(uint64_t seed, uint64_t mask, int64_t ops, int use_cache)
{
	struct world *w = calloc(1, sizeof *w);
	REQUIRE(w);
	REQUIRE(kv_pages_init(&w->kp, NPAGES) == 0);
	w->kp.hash_mask = mask;
	w->rng = seed;
	for (int b = 0; b < NBASE; b++)
		for (int t = 0; t < MAXT; t++)
			w->base[b][t] = (int32_t)rnd(w, b == 0 ? 3 : 1000); /* base 0: few distinct ids */
	for (int i = 0; i < NSEQ; i++)
		w->seq[i].kv.chain_page = -1;
	for (int64_t op = 0; op < ops; op++) {
		int i = (int)rnd(w, NSEQ);
		struct rseq *q = &w->seq[i];
		int64_t r = rnd(w, 100);
		if (!q->live) {
			if (r < 60) { /* admit: a base prefix (shared) plus a random tail */
				const int32_t *b = w->base[rnd(w, NBASE)];
				int64_t n = 1 + rnd(w, 5 * P), shared = rnd(w, n + 1);
				memcpy(q->tok, b, (size_t)shared * sizeof *q->tok);
				for (int64_t t = shared; t < n; t++)
					q->tok[t] = (int32_t)rnd(w, 4);
				q->n_tokens = n;
				q->kv.uid = (uint32_t)rnd(w, 3);
				q->n_computed = 0;
				rehash(q);
				admit(w, i, use_cache);
			}
		} else if (q->preempted) {
			if (r < 70)
				admit(w, i, use_cache); /* readmission: recompute, usually from cache */
			else if (r < 80) {
				q->live = 0; /* cancelled while waiting */
				q->preempted = 0;
			}
		} else if (r < 80) {
			compute(w, i, 1 + (rnd(w, 3) ? 0 : rnd(w, 2 * P)));
		} else if (r < 84) { /* cancel or finish */
			kv_pages_release(&w->kp, &q->kv);
			q->live = 0;
		} else if (r < 88) {
			kv_pages_release(&w->kp, &q->kv);
			q->n_computed = 0;
			q->preempted = 1;
		} else if (r < 100) { /* a twin: another sequence with the same tokens and uid */
			int j = (int)rnd(w, NSEQ);
			struct rseq *t = &w->seq[j];
			if (!t->live) {
				memcpy(t->tok, q->tok, (size_t)q->n_tokens * sizeof *t->tok);
				t->n_tokens = q->n_tokens;
				t->kv.uid = q->kv.uid;
				t->n_computed = 0;
				rehash(t);
				admit(w, j, use_cache);
			}
		}
		check_world(w);
	}
	/* Drain: everything released, every page back, no leak. */
	for (int i = 0; i < NSEQ; i++) {
		if (w->seq[i].live)
			kv_pages_release(&w->kp, &w->seq[i].kv);
		w->seq[i].live = 0;
		kv_seq_free(&w->seq[i].kv);
	}
	check_world(w);
	CHECK_EQ_INT(kv_pages_available(&w->kp), NPAGES);
	if (use_cache)
		CHECK(w->hits > 1000); /* the test exercised the prefix cache */
	CHECK(w->kp.n_evicted > 100);
	CHECK(w->preempts > 100); /* and page pressure */
	kv_pages_free(&w->kp);
	free(w);
}

TEST_T(kv_pages, random_ops, 120)
{
	run_random(1, ~0ull, 60000, 1);
}

TEST_T(kv_pages, random_ops_colliding_hash, 120)
{
	run_random(2, 0x3, 30000, 1);
}

TEST_T(kv_pages, random_ops_no_prefix_cache, 120)
{
	run_random(3, ~0ull, 10000, 0);
}
