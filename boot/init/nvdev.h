/*
 * nvdev.h — the NVIDIA driver's device nodes, made in the appliance image as nvidia-modprobe
 * makes them on a distribution. The driver registers its character devices but creates no
 * nodes (devtmpfs never sees them), and libcuda needs /dev/nvidiactl, one /dev/nvidiaN a GPU
 * and /dev/nvidia-uvm (with /dev/nvidia-uvm-tools) before cuInit can succeed.
 *
 * The plan comes from the running kernel, never from a count of PCI devices: the majors from
 * PROC/devices ("nvidia-frontend" or "nvidia": the control and GPU nodes, 195 on every driver
 * so far; "nvidia-uvm": dynamic), each GPU's minor from the "Device Minor:" line of
 * PROC/driver/nvidia/gpus/<PCI address>/information.
 *
 * Owns: reading the plan and making the nodes. Must not: load modules (init.c does, in the
 * configured order, before asking for the plan).
 */
#ifndef DSV32_NVDEV_H
#define DSV32_NVDEV_H

#include "model/err.h"

#define NVDEV_MAX 67 /* nodes: nvidiactl, uvm, uvm-tools, and up to 64 GPUs */
#define NVDEV_CTL_MINOR 255

struct nvdev_node {
	char name[24]; /* under /dev: "nvidiactl", "nvidia0", "nvidia-uvm", ... */
	unsigned major, minor;
};

/* The nodes the loaded driver needs, read under proc ("/proc"): their count, 0 when no NVIDIA
 * driver is loaded (no such major), or -errno with e naming the file and what was wrong (a
 * GPU without a readable minor, more GPUs than fit, a control device but no nvidia-uvm: the
 * uvm module not loaded, which CUDA needs). GPUs come in the order of their minors. */
int nvdev_plan(const char *proc, struct nvdev_node *out, int max, struct err *e);

/* Makes each node under dev ("/dev") as a character device of mode 0666. A node already
 * there with the same device number is kept; anything else there is an error. 0, or -errno
 * with e naming the node. */
int nvdev_make(const char *dev, const struct nvdev_node *nodes, int count, struct err *e);

#endif
