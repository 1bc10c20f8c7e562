package testenv

import (
	"io"
	"net/http"
	"time"
)

// Get is the HTTP status and body of a GET of url, within 2 s; the status
// is 0 and the body the error if the request failed.
func Get(url string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(b)
}

// Status is the HTTP status of a GET of url, 0 if the request failed.
func Status(url string) int {
	c, _ := Get(url)
	return c
}
