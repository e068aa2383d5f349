package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParseDelay(t *testing.T) {
	d, err := ParseDelay("25\n")
	if err != nil || d.Sync != 25*time.Millisecond || d.StallEvery != 0 {
		t.Fatalf("ParseDelay(25) = %+v, %v", d, err)
	}
	d, err = ParseDelay("0.5 4500 100")
	if err != nil || d.Sync != 500*time.Microsecond || d.Stall != 4500*time.Millisecond || d.StallEvery != 100 {
		t.Fatalf("ParseDelay(0.5 4500 100) = %+v, %v", d, err)
	}
	for _, bad := range []string{"", "fast", "-1", "10 20", "10 20 0", "10 x 3", "700000"} {
		if _, err := ParseDelay(bad); err == nil {
			t.Errorf("ParseDelay(%q) accepted", bad)
		}
	}
}

func TestStallEveryNthSync(t *testing.T) {
	d := Delay{Sync: time.Millisecond, Stall: time.Second, StallEvery: 3}
	got := []time.Duration{d.For(1), d.For(2), d.For(3), d.For(4), d.For(6)}
	want := []time.Duration{time.Millisecond, time.Millisecond, time.Second, time.Millisecond, time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sync delays %v, want %v", got, want)
		}
	}
}

func TestControlRereadsTheFileAndKeepsTheLastGoodValue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "delay")
	write := func(text string) {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("5")
	c := &Control{path: path}
	if got := c.Next(); got != 5*time.Millisecond {
		t.Fatalf("first sync waits %v, want 5ms", got)
	}
	write("40")
	if got := c.Next(); got != 40*time.Millisecond {
		t.Fatalf("after the change a sync waits %v, want 40ms", got)
	}
	write("garbage")
	if got := c.Next(); got != 40*time.Millisecond {
		t.Fatalf("with an unreadable file a sync waits %v, want the last 40ms", got)
	}
}
