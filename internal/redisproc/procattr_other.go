//go:build unix && !linux

package redisproc

import "syscall"

// procAttr is empty where the kernel cannot kill a child with its parent
// (macOS, the BSDs): Stop and Kill are then the only way the server ends.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
