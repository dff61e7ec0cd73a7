/*
 * dsv32d.c — the daemon: configuration, logging, systemd notification, signals, the model
 * load, and the serving loop.
 *
 * Logs go to stderr with syslog priority prefixes ("<6>..."), which journald reads.
 * Start-up: STATUS= for each loading stage with EXTEND_TIMEOUT_USEC, then a warm-up request
 * through the whole engine, then READY=1. The loop: poll the IPC server (never blocking while
 * the engine has work), hand requests to the scheduler, run one engine step, forward its
 * events, ping the watchdog. SIGTERM/SIGINT: STOPPING=1, new requests get `draining`, in-flight
 * ones get drain-timeout seconds to finish, then exit 0. An engine fault ends every request
 * with `engine_fault` and exits 1 so systemd restarts the service.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "boot/conf.h"
#include "boot/notify.h"
#include "boot/serve.h"
#include "driver/kernels.h"
#include "ipc/dsv32.h"
#include "ipc/server.h"
#include "model/clock.h"
#include "model/engine.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static void on_progress(void *ctx, const char *stage)
{
	(void)ctx;
	fprintf(stderr, "<6>dsv32d: %s\n", stage);
	notify_status("loading: %s", stage);
	notify_extend_timeout(120ull * 1000000); /* each stage may take up to 2 minutes more */
}

/* "1000,1001" -> ids; 0 or -EINVAL. */
static int parse_ids(const char *list, uint32_t *ids, uint32_t max, uint32_t *n)
{
	*n = 0;
	for (const char *p = list; *p;) {
		char *end;
		unsigned long v = strtoul(p, &end, 10);
		if (end == p || *n == max)
			return -EINVAL;
		ids[(*n)++] = (uint32_t)v;
		p = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct dsv32d_conf conf;
	struct err e = {""};
	conf_defaults(&conf);
	int r = conf_from_args(&conf, argc, argv, &e);
	if (r == 1)
		return 0;
	if (r) {
		fprintf(stderr, "<3>dsv32d: %s\n", e.msg);
		return 2;
	}
	if (!conf.model[0]) {
		fprintf(stderr, "<3>dsv32d: no model: give --model DIR or `model = DIR` in the config file\n");
		return 2;
	}
	fprintf(stderr, "<6>dsv32d %s starting; effective configuration:\n", dsv32_version());
	conf_print(&conf, stderr, "<6>  ");
	fprintf(stderr, "<6>dsv32d: %d embedded GPU kernel module(s)%s\n", n_kernel_images,
		n_kernel_images ? "" : " (CPU-only build)");

	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct engine en;
	struct engine_opts eo = {
		.model_dir = conf.model, .backend = conf.backend, .threads = (int)conf.threads,
		.kv_pages = conf.kv_pages, .host_memory_mb = conf.host_memory_mb,
		.max_batch_tokens = conf.max_batch_tokens, .max_seqs = conf.max_seqs,
		.max_context = conf.context_limit, .progress = on_progress,
		.synthetic_weights = conf.synthetic_weights >= 0,
		.synthetic_seed = (uint64_t)(conf.synthetic_weights >= 0 ? conf.synthetic_weights : 0),
		.batch_invariant = conf.batch_invariant == 1,
		.gpus = (int)conf.gpus,
		.mtp_draft = (int)conf.mtp_draft,
	};
	if ((r = engine_open(&en, &eo, &e))) {
		fprintf(stderr, "<3>dsv32d: %s\n", e.msg);
		notify_status("failed: %s", e.msg);
		return 1;
	}
	fprintf(stderr, "<6>dsv32d: %s: %lld layers + %lld MTP, backend %s%s%s, %lld KV pages (%.1f MiB), loaded in %.2f s%s\n",
		conf.model, (long long)en.c.num_hidden_layers, (long long)en.c.num_nextn_predict_layers,
		en.backend_name, strcmp(en.backend_name, "cuda") ? "" : " mode ",
		strcmp(en.backend_name, "cuda") ? "" : backend_cuda_mode(en.be),
		(long long)en.kv_pages, en.kv_bytes / 1048576.0, en.load_s,
		eo.synthetic_weights ? " (synthetic weights generated on the GPU: random, for benchmarks)" : "");
	notify_status("warming up");
	if ((r = engine_warmup(&en, &e))) {
		fprintf(stderr, "<3>dsv32d: warm-up failed: %s\n", e.msg);
		notify_status("failed: warm-up: %s", e.msg);
		engine_close(&en);
		return 1;
	}

	struct ipc_server_config ic;
	ipc_server_config_init(&ic);
	uint32_t uids[64], gids[64];
	if (parse_ids(conf.allow_uids, uids, 64, &ic.n_allow_uids) ||
	    parse_ids(conf.allow_gids, gids, 64, &ic.n_allow_gids)) {
		fprintf(stderr, "<3>dsv32d: allow-uids / allow-gids: expected comma-separated numbers\n");
		engine_close(&en);
		return 2;
	}
	ic.path = conf.socket;
	ic.socket_mode = conf.socket_mode;
	ic.allow_uids = uids;
	ic.allow_gids = gids;
	ic.max_clients = (uint32_t)conf.max_clients;
	ic.max_inflight_client = (uint32_t)conf.max_inflight_per_client;
	ic.max_inflight_total = (uint32_t)conf.max_inflight;
	ic.max_msg_bytes = (uint32_t)conf.max_message_bytes;
	if (ic.sq_data_bytes < ic.max_msg_bytes)
		ic.sq_data_bytes = ic.max_msg_bytes;
	if (ic.cq_entries < ic.max_inflight_client + 2)
		ic.cq_entries = ic.max_inflight_client + 2;
	struct ipc_server *ipc;
	if ((r = ipc_server_open(&ipc, &ic))) {
		fprintf(stderr, "<3>dsv32d: cannot serve on %s: %s\n", conf.socket, strerror(-r));
		engine_close(&en);
		return 1;
	}
	fprintf(stderr, "<6>dsv32d: serving on %s (epoch %llu)\n", conf.socket,
		(unsigned long long)ipc_server_epoch(ipc));
	notify_ready();
	notify_status("serving on %s", conf.socket);

	struct serve sv;
	serve_init(&sv, &en, ipc, &conf);
	uint64_t wd_usec = notify_watchdog_usec();
	double last_wd = clock_mono_s(), drain_deadline = 0;
	int exit_code = 0;
	struct ipc_item items[64];
	for (;;) {
		if (stop_requested && !drain_deadline) {
			fprintf(stderr, "<6>dsv32d: stopping: draining %lld request(s) for up to %lld s\n",
				(long long)serve_live(&sv), (long long)conf.drain_timeout_s);
			notify_stopping();
			ipc_server_set_draining(ipc, 1);
			drain_deadline = clock_mono_s() + (double)conf.drain_timeout_s;
		}
		if (drain_deadline && (!serve_live(&sv) || clock_mono_s() >= drain_deadline)) {
			if (serve_live(&sv))
				serve_fail_all(&sv, DSV32_E_DRAINING, "the server stopped before this request finished");
			break;
		}
		/* never sleep while the engine has work; otherwise sleep until a client acts */
		int busy = sched_has_work(en.s);
		int n = ipc_server_poll(ipc, busy ? 0 : (drain_deadline ? 50 : 200), items, 64);
		for (int i = 0; i < n; i++)
			serve_item(&sv, &items[i]);
		if ((r = serve_step(&sv))) {
			fprintf(stderr, "<2>dsv32d: engine fault %d (%s): ending every request and exiting\n",
				r, strerror(-r));
			serve_fail_all(&sv, DSV32_E_ENGINE_FAULT, "engine fault");
			exit_code = 1;
			break;
		}
		if (wd_usec && (clock_mono_s() - last_wd) * 1e6 >= (double)wd_usec / 2) {
			notify_watchdog();
			last_wd = clock_mono_s();
		}
	}
	/* terminal events are already in the clients' rings (emits publish and wake at once);
	 * closing tells every client the server is gone */
	serve_free(&sv);
	ipc_server_close(ipc);
	engine_close(&en);
	fprintf(stderr, "<6>dsv32d: exit %d\n", exit_code);
	return exit_code;
}
