// Command slow-disk-fs is a lab-only FUSE passthrough filesystem whose fsync and
// fdatasync take as long as a control file says: a disk that syncs small writes
// slowly, for the disk probe to measure for real (LAB ONLY: never shipped).
//
// Usage:
//
//	slow-disk-fs --backing DIR --mount DIR --control FILE
//
// Every file operation passes through to DIR (go-fuse's loopback nodes). Each
// FUSE_FSYNC (fsync(2), fdatasync(2), and the sync an O_SYNC/O_DSYNC write implies)
// first sleeps, then syncs the backing file. The control file is read again at every
// sync, so a test changes the disk's speed at run time by rewriting it. Its one line:
//
//	DELAY_MS [STALL_MS EVERY]
//
// DELAY_MS: every sync waits this long. STALL_MS EVERY: every EVERY-th sync (counted
// from the daemon's start) waits STALL_MS instead, a disk that mostly keeps up but
// stalls now and then. A missing or unreadable control file keeps the last value.
//
// What it models: the latency of a sync as the writer sees it, fixed or with
// periodic stalls. What it does not: read or write latency (they go to the backing
// filesystem at its speed), queueing (concurrent syncs each wait their own delay),
// jitter, throughput limits, errors, or data lost on a crash.
//
// It serves until it is unmounted (umount or fusermount -u) or sent SIGTERM/SIGINT,
// which unmounts it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Delay is one reading of the control file.
type Delay struct {
	Sync       time.Duration
	Stall      time.Duration
	StallEvery uint64
}

// ParseDelay reads "DELAY_MS [STALL_MS EVERY]".
func ParseDelay(text string) (Delay, error) {
	fields := strings.Fields(text)
	if len(fields) != 1 && len(fields) != 3 {
		return Delay{}, fmt.Errorf("want DELAY_MS [STALL_MS EVERY], got %q", strings.TrimSpace(text))
	}
	ms := func(s string) (time.Duration, error) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || v > 600_000 {
			return 0, fmt.Errorf("%q is not a delay in ms between 0 and 600000", s)
		}
		return time.Duration(v * float64(time.Millisecond)), nil
	}
	var d Delay
	var err error
	if d.Sync, err = ms(fields[0]); err != nil {
		return Delay{}, err
	}
	if len(fields) == 3 {
		if d.Stall, err = ms(fields[1]); err != nil {
			return Delay{}, err
		}
		if d.StallEvery, err = strconv.ParseUint(fields[2], 10, 64); err != nil || d.StallEvery == 0 {
			return Delay{}, fmt.Errorf("%q is not a positive count of syncs", fields[2])
		}
	}
	return d, nil
}

// For says how long the n-th sync (1-based) waits.
func (d Delay) For(n uint64) time.Duration {
	if d.StallEvery > 0 && n%d.StallEvery == 0 {
		return d.Stall
	}
	return d.Sync
}

// Control is the control file, read at every sync.
type Control struct {
	path  string
	syncs atomic.Uint64
	mu    sync.Mutex
	last  Delay
}

// Next counts a sync and returns how long it waits.
func (c *Control) Next() time.Duration {
	n := c.syncs.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if data, err := os.ReadFile(c.path); err == nil {
		if d, err := ParseDelay(string(data)); err == nil {
			c.last = d
		} else {
			log.Printf("control file %s: %v; keeping the last delay", c.path, err)
		}
	}
	return c.last.For(n)
}

// slowNode is a loopback node whose syncs wait first.
type slowNode struct {
	*fs.LoopbackNode
	control *Control
}

var (
	_ fs.NodeFsyncer     = (*slowNode)(nil)
	_ fs.NodeWrapChilder = (*slowNode)(nil)
)

// WrapChild makes every node below the root a slowNode too.
func (n *slowNode) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if loop, ok := ops.(*fs.LoopbackNode); ok {
		return &slowNode{LoopbackNode: loop, control: n.control}
	}
	return ops
}

// Fsync waits the control file's delay, then syncs the backing file. An interrupted
// wait (the caller was killed) returns EINTR without syncing.
func (n *slowNode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	timer := time.NewTimer(n.control.Next())
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
		return syscall.EINTR
	}
	if syncer, ok := f.(fs.FileFsyncer); ok {
		return syncer.Fsync(ctx, flags)
	}
	// The kernel sends a sync for an open file only, and loopback handles all sync.
	return 0
}

func main() {
	backing := flag.String("backing", "", "directory the files really live in")
	mount := flag.String("mount", "", "where to mount the slow view of it")
	controlPath := flag.String("control", "", "file holding DELAY_MS [STALL_MS EVERY]")
	flag.Parse()
	if *backing == "" || *mount == "" || *controlPath == "" {
		flag.Usage()
		os.Exit(2)
	}
	log.SetPrefix("slow-disk-fs: ")
	control := &Control{path: *controlPath}
	if data, err := os.ReadFile(*controlPath); err != nil {
		log.Fatalf("control file: %v", err)
	} else if control.last, err = ParseDelay(string(data)); err != nil {
		log.Fatalf("control file %s: %v", *controlPath, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(*backing, &st); err != nil {
		log.Fatalf("backing directory: %v", err)
	}
	root := &fs.LoopbackRoot{Path: *backing, Dev: uint64(st.Dev)}
	rootNode := &slowNode{LoopbackNode: &fs.LoopbackNode{RootData: root}, control: control}
	root.RootNode = rootNode
	server, err := fs.Mount(*mount, rootNode, &fs.Options{
		MountOptions: fuse.MountOptions{
			// FUSE serves only the mounting user's processes unless told otherwise; every
			// process of the lab host may use it, as with a real disk.
			AllowOther:  true,
			DirectMount: true,
			FsName:      *backing,
			Name:        "slow-disk",
		},
	})
	if err != nil {
		log.Fatalf("mount %s: %v", *mount, err)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		if err := server.Unmount(); err != nil {
			log.Printf("unmount %s: %v", *mount, err)
		}
	}()
	log.Printf("serving %s at %s (control %s)", *backing, *mount, *controlPath)
	server.Wait()
}
