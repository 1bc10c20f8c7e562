package redisproc

import "syscall"

// procAttr has the kernel kill the server when the process that started
// it dies, so a crashed test or demo leaves no redis-server behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
