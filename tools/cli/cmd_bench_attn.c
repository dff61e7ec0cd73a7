/*
 * cmd_bench_attn.c — `dsv32 bench attention`: the DeepSeek Sparse Attention kernels that exist
 * on the GPU (the indexer scan over the paged FP8 keys, and the top-2048 selection) at the real
 * dims (64 index heads x 128, index_topk 2048), contexts 1K..128K, batch 1..128, with the
 * indexer caches filled synthetically on the GPU. Prints time, bytes, FLOPs and the ratios to
 * the HBM read limit measured in the same run, and the sparse MLA decode over the chosen slots.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/gpu.h"
#include "model/cuda_attn.h"
#include "tools/cli/bench_gpu.h"
#include "tools/cli/cli.h"

#ifdef DSV32_NO_CUDA
int bench_attention(int argc, char **argv)
{
	fprintf(stderr, "dsv32 bench attention: this build has no CUDA support (static or no toolkit)\n");
	return 1;
}
#else

static float event_ms(struct gpu *g, CUevent a, CUevent b)
{
	float ms = 0;
	cu_check(cu.cuEventSynchronize(b), "cuEventSynchronize", __FILE__, __LINE__);
	cu.cuEventElapsedTime(&ms, a, b);
	return ms;
}

/* us per call of cuda_indexer_topk_mode with this mode, over reps calls; < 0 when it cannot run */
static double time_topk(struct gpu *g, CUevent e0, CUevent e1, int reps, gpu_ptr sc, int ld,
			gpu_ptr n, int km, gpu_ptr bt, int mb, gpu_ptr pos, int B, int mode)
{
	if (cuda_indexer_topk_mode(g, sc, ld, n, km, bt, mb, 0, pos, B, mode))
		return -1;
	cu.cuEventRecord(e0, g->stream);
	for (int r = 0; r < reps; r++)
		cuda_indexer_topk_mode(g, sc, ld, n, km, bt, mb, 0, pos, B, mode);
	cu.cuEventRecord(e1, g->stream);
	return event_ms(g, e0, e1) / reps * 1e3;
}

/* us per call of the sparse MLA decode with diag (cuda_mla_decode_diag), over reps calls */
static double time_mla(struct gpu *g, CUevent e0, CUevent e1, int reps, gpu_ptr mq, gpu_ptr pos, int nsel,
		       gpu_ptr mpool, int R, int MH, int B, float sc, gpu_ptr mo, gpu_ptr ws, int diag)
{
	if (cuda_mla_decode_diag(g, mq, pos, nsel, mpool, 656, R, MH, B, sc, mo, ws, diag))
		return -1;
	cu.cuEventRecord(e0, g->stream);
	for (int r = 0; r < reps; r++)
		cuda_mla_decode_diag(g, mq, pos, nsel, mpool, 656, R, MH, B, sc, mo, ws, diag);
	cu.cuEventRecord(e1, g->stream);
	return event_ms(g, e0, e1) / reps * 1e3;
}

/* The fixed costs under the batch-1 kernels (kernels_ptx/attn_bench.cu): the SM clock while one
 * SM spins (2^20 cycles of clock64 over the event time of one launch), the launch-to-launch time
 * of an empty kernel, and of an empty kernel with 200 KB of dynamic shared memory alternating
 * with one without (the carveout switch k_mla_decode and its neighbours pay). */
static void probe_fixed_costs(struct gpu *g, CUevent e0, CUevent e1)
{
	void *spin = gpu_kernel(g, "k_attn_spin"), *empty = gpu_kernel(g, "k_attn_empty");
	if (!spin || !empty)
		return;
	long long cyc = 1LL << 20;
	gpu_ptr none = 0;
	void *sa[] = {&cyc, &none}, *ea[] = {&none};
	gpu_launch(g, spin, 1, 1, 1, 32, 1, 1, 0, sa);
	cu.cuEventRecord(e0, g->stream);
	gpu_launch(g, spin, 1, 1, 1, 32, 1, 1, 0, sa);
	cu.cuEventRecord(e1, g->stream);
	double spin_ms = event_ms(g, e0, e1);
	const int n = 200;
	for (int r = 0; r < 10; r++)
		gpu_launch(g, empty, 1, 1, 1, 32, 1, 1, 0, ea);
	cu.cuEventRecord(e0, g->stream);
	for (int r = 0; r < n; r++)
		gpu_launch(g, empty, 1, 1, 1, 32, 1, 1, 0, ea);
	cu.cuEventRecord(e1, g->stream);
	double empty_us = event_ms(g, e0, e1) / n * 1e3;
	cu.cuEventRecord(e0, g->stream);
	for (int r = 0; r < n; r++)
		gpu_launch(g, empty, 132, 1, 1, 512, 1, 1, 0, ea);
	cu.cuEventRecord(e1, g->stream);
	double empty132_us = event_ms(g, e0, e1) / n * 1e3;
	unsigned big = 200 * 1024;
	if (gpu_kernel_smem(g, "k_attn_empty", &empty)) /* (its limit raised once) */
		return;
	cu.cuEventRecord(e0, g->stream);
	for (int r = 0; r < n; r++) {
		gpu_launch(g, empty, 132, 1, 1, 512, 1, 1, big, ea);
		gpu_launch(g, empty, 132, 1, 1, 512, 1, 1, 0, ea);
	}
	cu.cuEventRecord(e1, g->stream);
	double alt_us = event_ms(g, e0, e1) / n * 1e3;
	cu.cuEventRecord(e0, g->stream);
	for (int r = 0; r < n; r++)
		gpu_launch(g, empty, 132, 1, 1, 512, 1, 1, big, ea);
	cu.cuEventRecord(e1, g->stream);
	double bigonly_us = event_ms(g, e0, e1) / n * 1e3;
	printf("fixed costs: SM clock while one SM spins %.0f MHz; empty kernel launch to launch %.2f us (1 block), "
	       "%.2f us (132 x 512 threads), %.2f us (132 x 512 with 200 KB smem), a 200 KB + a 0 KB pair %.2f us\n\n",
	       (double)cyc / (spin_ms * 1e3), empty_us, empty132_us, bigonly_us, alt_us);
}

int bench_attention(int argc, char **argv)
{
	int reps = 10;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: dsv32 bench attention [--reps N]\n");
			return 2;
		}
	}
	struct gpu g;
	struct err e;
	if (gpu_open(&g, 0, &e)) {
		fprintf(stderr, "dsv32 bench attention: %s\n", e.msg);
		return 1;
	}
	const int H = 64, TOPK = 2048, ctxs[] = {1024, 8192, 32768, 131072}, batches[] = {1, 16, 64, 128};
	const long long page_bytes = 64 * 132;
	CUevent ev[2];
	if (gpu_timing_events(ev))
		return 1;
	CUevent e0 = ev[0], e1 = ev[1];
	void *scan = gpu_kernel(&g, "k_indexer_scores");
	unsigned long long seed = 7;
	double read_tbs = bench_read_limit(&g, 5);
	if (read_tbs <= 0)
		return 1;
	printf("GPU: %s; HBM streaming read (4 GiB): %.3f TB/s\n", g.name, read_tbs);
	probe_fixed_costs(&g, e0, e1);
	/* floors: scan = keys + scores at the read limit; top-k = one read of the scores; MLA =
	 * max(gathered records at the read limit, FLOPs at the bf16 dense tensor-core peak) */
	const double bf16_peak = bench_tensor_peak(&g, 0, NULL) * 1e12; /* 0: not known here */
	/* FlashMLA on this H200 (the peer: sparse FP8 decode, 128 heads, top-k 2048, one
	 * query token), by batch 1/16/64/128: measured there, so compared on an H200 only */
	const double peer_us[] = {18.5, 40.2, 97.8, 187.6};
	const int peer_here = strstr(g.name, "H200") != NULL;
	printf("floors: scan = ctx x 132 B + 4 B/key at the read limit; top-k = B x ctx x 4 B at the read "
	       "limit; MLA = max(B x nsel x 656 B at the read limit, 2 x B x 128 x nsel x 1088 FLOP at "
	       "%.0f TFLOP/s bf16)\n", bf16_peak / 1e12);
	printf("%7s %5s | %10s %7s %7s %8s %9s | %9s %7s %8s %8s | %9s %7s %8s %7s %9s %8s\n", "context", "batch",
	       "scan_us", "TB/s", "of_read", "TFLOP/s", "exact_us", "topk_us", "of_lim", "blk_us", "cl_us", "mla_us", "TB/s",
	       "TFLOP/s", "of_lim", "flashmla", "vs_peer");
	for (size_t ci = 0; ci < sizeof ctxs / sizeof *ctxs; ci++)
		for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
			int ctx = ctxs[ci], B = batches[bi], blocks = ctx / 64;
			/* every sequence has its own pages (the keys a decode step must read) */
			size_t pool_bytes = (size_t)B * blocks * page_bytes;
			gpu_ptr pool, q, w, bt, n, sc, pos;
			if (cu_check(cu.cuMemAlloc(&pool, pool_bytes), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&q, (size_t)B * H * 128), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&w, (size_t)B * H * 4), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&bt, (size_t)B * blocks * 4), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&n, (size_t)B * 4), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&sc, (size_t)B * ctx * 4), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&pos, (size_t)B * TOPK * 4), "cuMemAlloc", __FILE__, __LINE__))
				return 1;
			long long pbn = (long long)pool_bytes, qn = (long long)B * H * 128, wn = (long long)B * H;
			bench_fill_e4m3(&g, pool, pbn, seed);
			bench_fill_e4m3(&g, q, qn, seed);
			bench_fill_pow2(&g, w, wn, seed, -8, -4);
			int *hbt = malloc((size_t)B * blocks * 4), *hn = malloc((size_t)B * 4);
			for (int i = 0; i < B * blocks; i++)
				hbt[i] = i; /* page i of sequence b: b * blocks + i */
			for (int b = 0; b < B; b++)
				hn[b] = ctx;
			gpu_upload(&g, bt, hbt, (size_t)B * blocks * 4);
			gpu_upload(&g, n, hn, (size_t)B * 4);
			free(hbt), free(hn);
			int hh = H, mb = blocks, ld = ctx, km = TOPK;
			long long pb = page_bytes;
			void *sa[] = {&q, &w, &hh, &pool, &pb, &bt, &mb, &n, &sc, &ld};
			/* top-k: slots only (positions not needed), as the attention takes them */
			/* the fp32-exact scan (k_indexer_scores) once, for comparison, then the FP8 one */
			gpu_launch(&g, scan, (unsigned)(ctx / 256), (unsigned)B, 1, 128, 1, 1, 0, sa);
			cu.cuEventRecord(e0, g.stream);
			for (int r = 0; r < reps; r++)
				gpu_launch(&g, scan, (unsigned)(ctx / 256), (unsigned)B, 1, 128, 1, 1, 0, sa);
			cu.cuEventRecord(e1, g.stream);
			double scan16_ms = event_ms(&g, e0, e1) / reps;
			if (cuda_indexer_scores(&g, q, w, hh, pool, pb, bt, mb, n, sc, ld, B)) {
				fprintf(stderr, "dsv32 bench attention: cuda_indexer_scores failed\n");
				return 1;
			}
			cu.cuEventRecord(e0, g.stream);
			for (int r = 0; r < reps; r++)
				cuda_indexer_scores(&g, q, w, hh, pool, pb, bt, mb, n, sc, ld, B);
			cu.cuEventRecord(e1, g.stream);
			double scan_ms = event_ms(&g, e0, e1) / reps;
			/* the scan by keys a warp (the launcher picks one from the shape) */
			double kpw_us[5] = {0};
			if ((B == 1 && ctx >= 32768) || (B == 128 && ctx == 131072))
				for (int ki = 0; ki < 5; ki++) {
					int kpw = 16 << ki;
					cuda_indexer_scores_kpw(&g, q, w, hh, pool, pb, bt, mb, n, sc, ld, B, kpw);
					cu.cuEventRecord(e0, g.stream);
					for (int r = 0; r < reps; r++)
						cuda_indexer_scores_kpw(&g, q, w, hh, pool, pb, bt, mb, n, sc, ld, B, kpw);
					cu.cuEventRecord(e1, g.stream);
					kpw_us[ki] = event_ms(&g, e0, e1) / reps * 1e3;
				}
			if (cuda_indexer_topk(&g, sc, ld, n, km, bt, mb, 0, pos, B)) {
				fprintf(stderr, "dsv32 bench attention: cuda_indexer_topk failed\n");
				return 1;
			}
			cu.cuEventRecord(e0, g.stream);
			for (int r = 0; r < reps; r++)
				cuda_indexer_topk(&g, sc, ld, n, km, bt, mb, 0, pos, B);
			cu.cuEventRecord(e1, g.stream);
			double topk_ms = event_ms(&g, e0, e1) / reps;
			/* the kernels, whichever the default is: a block a row (1), a cluster of 8 (2) or 16
			 * (4) a row; the slots of 2 and 4 against 1's (the same set: the count of differing
			 * entries, 0 expected) */
			double topkm_ms[6] = {0};
			long long topk_differ[6] = {0};
			int *ref_slots = malloc((size_t)B * TOPK * 4), *got_slots = malloc((size_t)B * TOPK * 4);
			for (int mode = 1; mode <= 5; mode++) {
				if (mode == 3)
					continue;
				double us = time_topk(&g, e0, e1, reps, sc, ld, n, km, bt, mb, pos, B, mode);
				if (us < 0) {
					topkm_ms[mode] = -1;
					continue;
				}
				topkm_ms[mode] = us * 1e-3;
				gpu_download(&g, mode == 1 ? ref_slots : got_slots, pos, (size_t)B * TOPK * 4);
				if (mode > 1)
					for (int i = 0; i < B * TOPK; i++)
						topk_differ[mode] += got_slots[i] != ref_slots[i];
			}
			free(ref_slots), free(got_slots);
			/* the cluster kernels by phases at batch 1: stopped after the load, round 0, all
			 * rounds (rows 0-2: modes 2, 4, 5) */
			static const int stop_mode[3] = {2, 4, 5};
			double stop_us[3][4] = {{0}};
			if (B == 1 && ctx >= 8192)
				for (int kk = 0; kk < 3; kk++)
					for (int st = 1; st <= 3; st++) {
						double us = time_topk(&g, e0, e1, reps, sc, ld, n, km, bt, mb, pos, B,
								      stop_mode[kk] | st << 4);
						if (us >= 0)
							stop_us[kk][st] = us;
					}
			/* the forward's order at batch 1 and 16: the scan, then the top-k launched as its
			 * programmatic dependent; the pair's us by top-k kernel (mode 0 = the default) */
			double pair_us[6] = {0};
			if (B == 1 || B == 16)
				for (int mode = 0; mode <= 5; mode++) {
					if (mode == 3 || topkm_ms[mode] < 0)
						continue;
					cuda_indexer_scores(&g, q, w, hh, pool, pb, bt, mb, n, sc, ld, B);
					cuda_indexer_topk_mode(&g, sc, ld, n, km, bt, mb, 0, pos, B, mode);
					cu.cuEventRecord(e0, g.stream);
					for (int r = 0; r < reps; r++) {
						cuda_indexer_scores(&g, q, w, hh, pool, pb, bt, mb, n, sc, ld, B);
						cuda_indexer_topk_mode(&g, sc, ld, n, km, bt, mb, 0, pos, B, mode);
					}
					cu.cuEventRecord(e1, g.stream);
					pair_us[mode] = event_ms(&g, e0, e1) / reps * 1e3;
				}
			cuda_indexer_topk(&g, sc, ld, n, km, bt, mb, 0, pos, B); /* the default's slots */
			/* sparse MLA decode over the selected slots: 128 heads, 656-byte records in a pool
			 * of B * blocks pages (the slots the top-k just chose) */
			const int MH = 128, R = 512, nsel = ctx < TOPK ? ctx : TOPK;
			size_t mla_pool = (size_t)B * blocks * 64 * 656;
			gpu_ptr mpool, mq, mo;
			if (cu_check(cu.cuMemAlloc(&mpool, mla_pool), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&mq, (size_t)B * MH * (R + 64) * 2), "cuMemAlloc", __FILE__, __LINE__) ||
			    cu_check(cu.cuMemAlloc(&mo, (size_t)B * MH * R * 2), "cuMemAlloc", __FILE__, __LINE__))
				return 1;
			long long mpn = (long long)mla_pool;
			bench_fill_e4m3(&g, mpool, mpn, seed);
			gpu_memset(&g, mq, 0x3c, (size_t)B * MH * (R + 64) * 2); /* bf16 ~0.0115 */
			const float sc_att = 0.1352337789f;
			gpu_ptr mws = 0;
			size_t mwsb = cuda_mla_decode_workspace(&g, B, MH, R, TOPK);
			if (mwsb && cu_check(cu.cuMemAlloc(&mws, mwsb), "cuMemAlloc", __FILE__, __LINE__))
				return 1;
			cuda_mla_decode(&g, mq, pos, TOPK, mpool, 656, R, MH, B, sc_att, mo, mws);
			cu.cuEventRecord(e0, g.stream);
			for (int r = 0; r < reps; r++)
				cuda_mla_decode(&g, mq, pos, TOPK, mpool, 656, R, MH, B, sc_att, mo, mws);
			cu.cuEventRecord(e1, g.stream);
			double mla_ms = event_ms(&g, e0, e1) / reps;
			/* the kernels apart at the same shape, auto splits: k_mla_decode (mma.sync, diag 0),
			 * k_mla_decode_wg; at 32K x 128 the latter's phases */
			double old_us = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws, 0);
			double wg_us = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws, 128);
			/* the pair k_mla_decode_wg2 (diag bit 16) */
			double wg2_us = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws, 0x10080);
			/* and with P V of a tile and S of the next issued together (diag bit 20) */
			double wg2f_us = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws, 0x110080);
			/* and with the light handover (diag bit 21) */
			double wg2l_us = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws, 0x210080);
			/* 32K x 128: both wgmma kernels by phases (1-7: the kernel's switches of gathers, MMAs,
			 * dequantisation; 8: no softmax) */
			double wg_diag_us[9] = {0}, wg2_diag_us[9] = {0}, wg2l_diag_us[9] = {0};
			if (ctx == 32768 && B == 128)
				for (int di = 1; di < 9; di++) {
					const int d = di == 8 ? 0x80000 : di;
					wg_diag_us[di] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws,
								  128 | d);
					wg2_diag_us[di] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws,
								   0x10080 | d);
					wg2l_diag_us[di] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws,
								    0x210080 | d);
				}
			/* where the MLA time goes (32K, batch 1 and 128): the kernel with phases switched off */
			double diag_us[8] = {0};
			const int diags[] = {1, 2, 4, 3, 6, 7};
			if (ctx == 32768 && (B == 1 || B == 128))
				for (size_t di = 0; di < sizeof diags / sizeof *diags; di++) {
					cuda_mla_decode_diag(&g, mq, pos, TOPK, mpool, 656, R, MH, B, sc_att, mo, mws, diags[di]);
					cu.cuEventRecord(e0, g.stream);
					for (int r = 0; r < reps; r++)
						cuda_mla_decode_diag(&g, mq, pos, TOPK, mpool, 656, R, MH, B, sc_att, mo, mws,
								     diags[di]);
					cu.cuEventRecord(e1, g.stream);
					diag_us[diags[di]] = event_ms(&g, e0, e1) / reps * 1e3;
				}
			/* 32K: k_mla_decode_wg by key splits (forced: 1, 2, 4, 8, 16, 32) */
			double wg_split_us[6] = {0};
			if (ctx == 32768) {
				gpu_ptr ws32;
				if (cu_check(cu.cuMemAlloc(&ws32, (size_t)B * MH * 32 * (R + 2) * 4), "cuMemAlloc", __FILE__,
					     __LINE__))
					return 1;
				for (int si = 0; si < 6; si++)
					wg_split_us[si] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, ws32,
								   128 | (1 << si) << 8);
				cu.cuMemFree(ws32);
			}
			/* batch 1, k_mla_decode_wg2: the time by key splits (forced; 64 = one 32-key tile a
			 * split), the decode kernel alone and the combine alone */
			double split_us[7][4] = {{0}};
			if (ctx == 32768 && B == 1) {
				gpu_ptr ws64;
				if (cu_check(cu.cuMemAlloc(&ws64, (size_t)B * MH * 64 * (R + 2) * 4), "cuMemAlloc", __FILE__,
					     __LINE__))
					return 1;
				for (int si = 0; si < 6; si++) { /* k_mla_decode_wg2, 2 .. 64 splits */
					int d = 128 | 0x10000 | (2 << si) << 8;
					split_us[si][0] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, ws64, d);
					split_us[si][1] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, ws64, d | 8);
					split_us[si][2] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, ws64,
								   d | 16);
				}
				cu.cuMemFree(ws64);
				/* the decode kernel alone (auto splits) without Q's load, without the stores,
				 * without both */
				const int qd[3] = {0x10080 | 8 | 32, 0x10080 | 8 | 64, 0x10080 | 8 | 32 | 64};
				for (int j = 0; j < 3; j++)
					split_us[6][1 + j] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo,
								      mws, qd[j]);
				cuda_attn_set_pdl(0); /* the combine launched after the decode grid instead */
				split_us[6][0] = time_mla(&g, e0, e1, reps, mq, pos, TOPK, mpool, R, MH, B, sc_att, mo, mws, 0x10080);
				cuda_attn_set_pdl(1);
			}
			double mla_flops = 2.0 * B * MH * (double)nsel * (R + 64 + R);
			double mla_bytes = (double)B * nsel * 656 + (double)B * MH * (R + 64) * 2 + (double)B * MH * R * 2;
			double mla_floor = mla_bytes / (read_tbs * 1e12);
			if (bf16_peak > 0 && mla_flops / bf16_peak > mla_floor)
				mla_floor = mla_flops / bf16_peak;
			cu.cuMemFree(mpool), cu.cuMemFree(mq), cu.cuMemFree(mo);
			if (mws)
				cu.cuMemFree(mws);
			double bytes = (double)pool_bytes + (double)B * ctx * 4; /* keys in, scores out */
			double flops = 2.0 * B * H * 128.0 * ctx;
			double tbs = bytes / (scan_ms * 1e-3) / 1e12;
			double topk_floor = (double)B * ctx * 4 / (read_tbs * 1e12);
			char peer[16] = "-", vs[16] = "-";
			if (nsel == TOPK && peer_here) {
				snprintf(peer, sizeof peer, "%.1f", peer_us[bi]);
				snprintf(vs, sizeof vs, "%.2fx", peer_us[bi] / (mla_ms * 1e3));
			}
			printf("%7d %5d | %10.2f %7.3f %6.0f%% %8.1f %9.2f | %9.2f %6.0f%% %8.2f %8.2f | %9.2f %7.3f %8.1f %6.0f%% %9s %8s\n",
			       ctx, B, scan_ms * 1e3, tbs, 100.0 * tbs / read_tbs, flops / (scan_ms * 1e-3) / 1e12,
			       scan16_ms * 1e3, topk_ms * 1e3, 100.0 * topk_floor / (topk_ms * 1e-3), topkm_ms[1] * 1e3,
			       topkm_ms[2] * 1e3, mla_ms * 1e3,
			       mla_bytes / (mla_ms * 1e-3) / 1e12, mla_flops / (mla_ms * 1e-3) / 1e12,
			       100.0 * mla_floor / (mla_ms * 1e-3), peer, vs);
			if (wg_us > 0)
				printf("        by kernel: k_mla_decode (mma.sync) %.2f us, %.1f TFLOP/s | k_mla_decode_wg %.2f us, "
				       "%.1f TFLOP/s | k_mla_decode_wg2 (the pair of head groups a cluster) %.2f us, %.1f TFLOP/s | "
				       "wg2 fused (P V and the next S together) %.2f us, %.1f TFLOP/s | wg2 light (CTA-scope handover) "
				       "%.2f us, %.1f TFLOP/s\n",
				       old_us, mla_flops / (old_us * 1e-6) / 1e12, wg_us, mla_flops / (wg_us * 1e-6) / 1e12, wg2_us,
				       mla_flops / (wg2_us * 1e-6) / 1e12, wg2f_us, mla_flops / (wg2f_us * 1e-6) / 1e12, wg2l_us,
				       mla_flops / (wg2l_us * 1e-6) / 1e12);
			if (wg_split_us[0] != 0)
				printf("        k_mla_decode_wg by key splits (auto: %d), us: 1: %.1f | 2: %.1f | 4: %.1f | 8: %.1f | "
				       "16: %.1f | 32: %.1f\n", cuda_mla_decode_splits(&g, B, MH, TOPK), wg_split_us[0],
				       wg_split_us[1], wg_split_us[2], wg_split_us[3], wg_split_us[4], wg_split_us[5]);
			for (int k = 0; k < 3; k++) {
				const double *du = k == 2 ? wg2l_diag_us : k ? wg2_diag_us : wg_diag_us;
				if (du[1] > 0)
					printf("        %s phases (us): all %.1f | no gather %.1f | no MMA %.1f | no dequant %.1f | "
					       "no gather+MMA %.1f | no gather+dequant (MMA only) %.1f | no MMA+dequant %.1f | none of "
					       "the three %.1f | no softmax %.1f\n",
					       k == 2 ? "k_mla_decode_wg2 light" : k ? "k_mla_decode_wg2" : "k_mla_decode_wg",
					       k == 2 ? wg2l_us : k ? wg2_us : wg_us, du[1], du[2], du[4], du[3],
					       du[5], du[6], du[7], du[8]);
			}
			if (diag_us[1] > 0)
				printf("        k_mla_decode phases (us): all %.1f | no gather %.1f | no MMA %.1f | no dequant %.1f | "
				       "no gather+MMA %.1f | no MMA+dequant %.1f | none of the three %.1f\n",
				       old_us, diag_us[1], diag_us[2], diag_us[4], diag_us[3], diag_us[6], diag_us[7]);
			printf("        top-k by kernel, us: k_topk_cl16 %.2f (slots differing from k_topk_select's: %lld; "
			       "k_topk_cl8's: %lld) | k_topk_cl4 %.2f (differing: %lld; -1000: cannot take the row)\n",
			       topkm_ms[4] * 1e3, topk_differ[4], topk_differ[2], topkm_ms[5] * 1e3, topk_differ[5]);
			static const char *const stop_name[3] = {"k_topk_cl8", "k_topk_cl16", "k_topk_cl4"};
			for (int kk = 0; kk < 3; kk++)
				if (stop_us[kk][1] != 0)
					printf("        %s by phases, us: load %.2f | + round 0 %.2f | + rounds %.2f | "
					       "+ output %.2f\n", stop_name[kk], stop_us[kk][1], stop_us[kk][2], stop_us[kk][3],
					       topkm_ms[stop_mode[kk]] * 1e3);
			if (pair_us[0] != 0)
				printf("        scan + top-k (its programmatic dependent), us: default %.2f | k_topk_select %.2f | "
				       "k_topk_cl8 %.2f | k_topk_cl16 %.2f | k_topk_cl4 %.2f | scan alone %.2f\n", pair_us[0],
				       pair_us[1], pair_us[2], pair_us[4], pair_us[5], scan_ms * 1e3);
			if (kpw_us[0] != 0)
				printf("        scan by keys a warp, us: 16: %.2f | 32: %.2f | 64: %.2f | 128: %.2f | 256: %.2f\n",
				       kpw_us[0], kpw_us[1], kpw_us[2], kpw_us[3], kpw_us[4]);
			if (split_us[0][0] != 0) {
				printf("        k_mla_decode_wg2 batch 1 by key splits (auto: %d), us: all / decode kernel alone / combine alone:",
				       cuda_mla_decode_splits(&g, B, MH, TOPK));
				for (int si = 0; si < 6; si++)
					printf(" | %d: %.1f / %.1f / %.1f", 2 << si, split_us[si][0], split_us[si][1], split_us[si][2]);
				printf(" | auto without the combine's programmatic launch: %.1f\n", split_us[6][0]);
				printf("        k_mla_decode_wg2 batch 1, the decode kernel alone (auto splits), us: without Q's load %.1f | without "
				       "the stores %.1f | without both %.1f\n", split_us[6][1], split_us[6][2], split_us[6][3]);
			}
			fflush(stdout);
			cu.cuMemFree(pool), cu.cuMemFree(q), cu.cuMemFree(w), cu.cuMemFree(bt);
			cu.cuMemFree(n), cu.cuMemFree(sc), cu.cuMemFree(pos);
		}
	printf("\ncommand: dsv32 bench attention --reps %d (scan = cuda_indexer_scores (k_indexer_scores_fp8, FP8 MMA), "
	       "exact_us = k_indexer_scores (fp16 MMA on exact e4m3 copies): one query per sequence, "
	       "64 heads x 128, FP8 keys in 132-byte page slots, every sequence its own pages; "
	       "cuda_indexer_topk (from 8K keys k_topk_cl16 at batch 1 from 64K keys, k_topk_cl4 at batch 2-16 up to 130816 keys, else k_topk_cl8 while 8 x batch <= the SMs, else k_topk_select; blk_us = k_topk_select, cl_us = k_topk_cl8 (clusters of 8 CTAs a row)): 2048 of ctx; mla = cuda_mla_decode (k_mla_decode_wg2 light, else k_mla_decode_wg, else k_mla_decode): 128 heads over the selected slots, 656-byte records)\n", reps);
	printf("targets (issue 10): scan >= 2.5 TB/s at 128K; top-k <= 50 us at 128K x 128; MLA decode <= 25 us "
	       "at batch 1 and >= 200 TFLOP/s at batch 128 (flashmla = FlashMLA's us on the H200, vs_peer = "
	       "its time / ours; \"-\" on other GPUs)\n");
	gpu_timing_events_free(ev);
	gpu_close(&g);
	return 0;
}
#endif
